"""The engine: certified learner-unlearners, pure numpy.  ``ALGORITHMS`` maps a spec's algorithm name to its class."""
from __future__ import annotations

from .base import (ArrayRetained, CapacityExhausted, ForgetError, InputError, ModelSpec, NotDeletable, SpecError,
                   Unlearner,
                   validate_examples)
from .certificate import Certificate
from .noise import NoiseSource, SecureGaussianNoise, SeededNoise
from .active import ActiveOLU
from .descent_to_delete import DescentToDelete
from .discard import DiscardAndRestart
from .dp_tree import OnlineDPTree
from .memory_pair import MemoryPair
from .passive import PassiveOLU
from .restart import PassiveOLURestart
from .retrain import RetrainOGD
from .rewind import RewindToDelete
from .second_order import SecondOrderOLU

ALGORITHMS: dict[str, type[Unlearner]] = {
    cls.algorithm: cls for cls in (PassiveOLU, PassiveOLURestart, ActiveOLU, RetrainOGD, DescentToDelete, RewindToDelete,
                               MemoryPair, DiscardAndRestart, OnlineDPTree, SecondOrderOLU)
}


def engine_class(algorithm: str) -> type[Unlearner]:
    try:
        return ALGORITHMS[algorithm]
    except KeyError:
        raise SpecError(f"unknown algorithm {algorithm!r}; available: {', '.join(sorted(ALGORITHMS))}") from None


def warm_kernels(background: bool = True) -> None:
    """Compile (or load from numba's cache) the compiled kernels: in a background thread (the service at start-up:
    requests take the numpy path meanwhile), or now (``olu warm``, the image build).  A no-op without numba."""
    from . import fast, fast_dgauss

    for module in (fast, fast_dgauss):
        (module.warm_up_async if background else module.warm_up)()


def kernels_status() -> str:
    """"ok" once the compiled kernels are loaded, "compiling" while the numpy path serves, "off" without numba
    (OLU_NUMBA=0 or not importable: the numpy path always), "failed" if the compilation ended without them."""
    from . import fast, fast_dgauss

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
