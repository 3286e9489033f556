"""The model specification (``ModelSpec``) and the bounds and limits every family shares: what the engine certifies
derives from the spec alone."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .errors import SpecError

# Inputs may exceed a declared bound by this relative amount (float round-off of a client that
# normalised its vectors); the public constants are computed with the bound inflated by the same
# factor, so every certified constant stays true.
BOUND_TOLERANCE = 1e-9
# Hyperparameters every family takes (issue 21): the retained-record cap of the families whose work grows with the
# records they keep, and the most examples one learn request / records one forget request may name; the service
# fills them in at creation from its work budget where they bind (app/registry.py); the engine enforces them
# (learn_capacity, learn_batch_limit, forget).
LIMIT_KEYS = ("max_records", "max_learn_batch", "max_forget_batch")


def normalize_limits(limits: Mapping[str, Any]) -> dict[str, Any]:
    """``max_records`` / ``max_forget_batch``: absent, null or an integer >= 1."""
    out: dict[str, Any] = {}
    for key, v in limits.items():
        if v is None:
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= int(v) <= 10**12:
            raise SpecError(f"{key} must be an integer in [1, 10^12]", fields=(f"hyperparameters.{key}",))
        out[key] = int(v)
    return out


@dataclass(frozen=True)
class ModelSpec:
    """Immutable, public description of a model.  Everything the engine certifies derives from it."""

    algorithm: str
    loss: str
    dim: int
    x_norm: float
    y_abs: float
    domain_radius: float
    l2: float
    epsilon: float
    delta: float
    rho: float  # zCDP budget the (epsilon, delta) target was calibrated to (app.privacy)
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    # the feature-dictionary spec (app/features.py) or None for dense inputs: used by the service to encode
    # dictionaries into dense vectors before the engine sees them; engines never read it
    features: Mapping[str, Any] | None = None
    # classifiers: the number of classes K, and optionally their names (labels are indices 0..K-1); loss softmax
    # always, loss squared for a family that classifies by least squares (``Unlearner.classifier_losses``); 0 otherwise
    n_classes: int = 0
    classes: tuple[str, ...] | None = None
    # a public feature map (app/feature_map.py) or None: the service maps each raw row to phi(x) before the engine
    # sees it (``dim`` is then the mapped dimension and ``x_norm`` the map's bound); engines never read it
    feature_map: Mapping[str, Any] | None = None

    @property
    def n_params(self) -> int:
        """Length of the flattened parameter vector: d + 1, or K (d + 1) for a classifier of K classes (softmax,
        losses.py; least squares, exact_ridge)."""
        return (self.dim + 1) * (self.n_classes or 1)

    def with_hyperparameters(self, hp: Mapping[str, Any]) -> "ModelSpec":
        return ModelSpec(**{**self.__dict__, "hyperparameters": dict(hp)})
