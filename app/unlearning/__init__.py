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
from .contract.knobs import KnobTable, check_knobs, knob_schema
from .families.exact_ridge import ExactRidge
from .families.hyperparameters import TABLES as HYPERPARAMETER_TABLES
from .families.memory_pair import MemoryPair
from .families.passive import PassiveOLU
from .families.restart import PassiveOLURestart
from .families.retrain import RetrainOGD
from .families.rewind import RewindToDelete
from .families.second_order import SecondOrderOLU
from .families.sisa import SISA
from .mechanism.noise import NoiseSource, SecureGaussianNoise, SeededNoise


ALGORITHMS: dict[str, type[Unlearner]] = {
    cls.algorithm: cls for cls in (PassiveOLU, PassiveOLURestart, ActiveOLU, RetrainOGD, DescentToDelete, RewindToDelete,
                               MemoryPair, DiscardAndRestart, OnlineDPTree, SecondOrderOLU, SISA, ExactRidge)
}


def engine_class(algorithm: str) -> type[Unlearner]:
    try:
        return ALGORITHMS[algorithm]
    except KeyError:
        raise SpecError(f"unknown algorithm {algorithm!r}; available: {', '.join(sorted(ALGORITHMS))}") from None


def hyperparameter_table(algorithm: str) -> KnobTable:
    """The family's hyperparameter table (families/hyperparameters.py): its knobs, losses and rules."""
    engine_class(algorithm)  # an unknown name: the same refusal as everywhere
    return HYPERPARAMETER_TABLES[algorithm]


def hyperparameter_schema(algorithm: str) -> dict:
    """The JSON Schema of the family's ``hyperparameters`` (contract/knobs.py ``knob_schema``)."""
    return knob_schema(algorithm, hyperparameter_table(algorithm))


def check_new_hyperparameters(algorithm: str, loss: str, hyperparameters) -> None:
    """A new model's loss and hyperparameters against the family's table: unknown names (with the closest accepted
    one), types, choices, ranges and knobs that do not apply are refused with a ``SpecError`` naming the field."""
    check_knobs(algorithm, hyperparameter_table(algorithm), loss, hyperparameters or {})


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
    "ALGORITHMS", "ArrayRetained", "check_new_hyperparameters", "hyperparameter_schema", "hyperparameter_table", "CapacityExhausted", "Certificate", "ForgetError", "InputError", "ModelSpec", "NotDeletable", "NoiseSource",
    "SecureGaussianNoise", "SeededNoise", "SpecError", "Unlearner", "engine_class", "kernels_status", "validate_examples",
    "warm_kernels",
]
