"""The engine: certified learner-unlearners, pure numpy.  ``ALGORITHMS`` maps a spec's algorithm name to its class."""
from __future__ import annotations

from .contract.certificate import Certificate
from .contract.errors import CapacityExhausted, ForgetError, InputError, NotDeletable, SpecError
from .contract.spec import ModelSpec
from .contract.unlearner import ArrayRetained, Unlearner, validate_examples
from .families.active import ActiveOLU
from .families.descent_to_delete import DescentToDelete
from .families.discard import DiscardAndRestart
from .families.dp_tree import OnlineDPTree
from .families.exact_ridge import ExactRidge
from .families.memory_pair import MemoryPair
from .families.passive import PassiveOLU
from .families.restart import PassiveOLURestart
from .families.retrain import RetrainOGD
from .families.rewind import RewindToDelete
from .families.second_order import SecondOrderOLU
from .families.sisa import SISA
from .mechanism.noise import NoiseSource, SecureGaussianNoise, SeededNoise

# Issue 36 item 1 wiring (to move into ExactRidge's class body when issue 36 item 5's exact_ridge.py lands): its
# learn adds exact integer sums, so batches learned one after another equal their concatenation bit for bit and the
# service may log a learn as its batch (Unlearner.learn_replays_exactly; tests/test_state_log.py checks the claim).
ExactRidge.learn_replays_exactly = True

ALGORITHMS: dict[str, type[Unlearner]] = {
    cls.algorithm: cls for cls in (PassiveOLU, PassiveOLURestart, ActiveOLU, RetrainOGD, DescentToDelete, RewindToDelete,
                               MemoryPair, DiscardAndRestart, OnlineDPTree, SecondOrderOLU, SISA, ExactRidge)
}


def engine_class(algorithm: str) -> type[Unlearner]:
    try:
        return ALGORITHMS[algorithm]
    except KeyError:
        raise SpecError(f"unknown algorithm {algorithm!r}; available: {', '.join(sorted(ALGORITHMS))}") from None


def warm_kernels(background: bool = True) -> None:
    """Compile (or load from numba's cache) the compiled kernels: in a background thread (the service at start-up:
    requests take the numpy path meanwhile), or now (``olu warm``, the image build).  A no-op without numba."""
    from .mechanism import fast, fast_dgauss

    for module in (fast, fast_dgauss):
        (module.warm_up_async if background else module.warm_up)()


def kernels_status() -> str:
    """"ok" once the compiled kernels are loaded, "compiling" while the numpy path serves, "off" without numba
    (OLU_NUMBA=0 or not importable: the numpy path always), "failed" if the compilation ended without them."""
    from .mechanism import fast, fast_dgauss

    if not (fast.available() or fast_dgauss.available()):
        return "off"
    if fast.ready() and fast_dgauss.ready():
        return "ok"
    return "compiling" if (fast.warming() or fast_dgauss.warming()) else "failed"


__all__ = [
    "ALGORITHMS", "ArrayRetained", "CapacityExhausted", "Certificate", "ForgetError", "InputError", "ModelSpec", "NotDeletable", "NoiseSource",
    "SecureGaussianNoise", "SeededNoise", "SpecError", "Unlearner", "engine_class", "kernels_status", "validate_examples",
    "warm_kernels",
]
