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


__all__ = [
    "ALGORITHMS", "ArrayRetained", "CapacityExhausted", "Certificate", "ForgetError", "InputError", "ModelSpec", "NotDeletable", "NoiseSource",
    "SecureGaussianNoise", "SeededNoise", "SpecError", "Unlearner", "engine_class", "validate_examples",
]
