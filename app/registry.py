"""ModelRegistry: spec -> engine instance; engine state <-> stored blob; per-process cache by version.

The only place that maps the stored model onto the engine.  It never branches on algorithm names: the
engine class named by the spec supplies its own hyperparameter defaults, constants and accounting.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from .privacy import rho_from_epsilon_delta
from .db.state_codec import pack_state, unpack_state
from .unlearning import ModelSpec, SpecError, Unlearner, engine_class, fast, fast_dgauss
from .unlearning.losses import make_loss

CONVERSION = "cks20"


def build_spec(payload: dict[str, Any], *, max_dim: int) -> ModelSpec:
    """Validate a ModelCreate payload into an engine spec with every default filled in."""
    if payload["dim"] > max_dim:
        raise SpecError(f"dim must be at most {max_dim}")
    cls = engine_class(payload["algorithm"])
    privacy = payload["privacy"]
    rho = rho_from_epsilon_delta(privacy["epsilon"], privacy["delta"], conversion=CONVERSION)
    spec = ModelSpec(
        algorithm=payload["algorithm"], loss=payload["loss"], dim=int(payload["dim"]),
        x_norm=float(payload["bounds"]["x_norm"]), y_abs=float(payload["bounds"]["y_abs"]),
        domain_radius=float(payload["domain_radius"]), l2=float(payload["l2"]),
        epsilon=float(privacy["epsilon"]), delta=float(privacy["delta"]), rho=rho,
        hyperparameters=dict(payload.get("hyperparameters") or {}),
    )
    spec = spec.with_hyperparameters(cls.normalize_hyperparameters(spec))
    cls(spec)  # constructing validates the whole spec (constants, schedule) before anything is stored
    return spec


def spec_to_json(spec: ModelSpec) -> str:
    return json.dumps({**spec.__dict__, "hyperparameters": dict(spec.hyperparameters)}, sort_keys=True)


def spec_from_json(text: str) -> ModelSpec:
    return ModelSpec(**json.loads(text))


def loss_for(spec: ModelSpec):
    """The declared loss with its public constants: what validation and predictions use (no engine state)."""
    return make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, spec.hyperparameters)


def published_bytes(theta: np.ndarray) -> bytes:
    return np.ascontiguousarray(theta, dtype="<f8").tobytes()


def published_array(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f8")


class ModelRegistry:
    """Builds engines and caches them per process, keyed by model id and state version."""

    def __init__(self, capacity: int = 256, cipher=None):
        self.cipher = cipher  # app.crypto.Cipher: state blobs are sealed at rest (AES-GCM, AAD = model id)
        self._cache: OrderedDict[str, tuple[int, Unlearner]] = OrderedDict()
        self._lock = threading.Lock()
        self.capacity = capacity
        fast.warm_up_async()  # compile passive OLU's OGD loop off the request path (no-op without numba)
        fast_dgauss.warm_up_async()  # and the discrete Gaussian sampler's kernel

    @staticmethod
    def new_engine(spec: ModelSpec) -> Unlearner:
        return engine_class(spec.algorithm)(spec)

    def checkout(self, model_id: str, version: int, spec_json: str, load_blob) -> Unlearner:
        """An engine at ``version`` for exclusive use by one write (taken out of the cache).

        ``load_blob()`` reads the secret state only when the cached copy is missing or stale.
        """
        with self._lock:
            cached = self._cache.pop(model_id, None)
        if cached is not None and cached[0] == version:
            return cached[1]
        spec = spec_from_json(spec_json)
        blob = load_blob()
        if self.cipher is not None:
            blob = self.cipher.open(blob, "state", model_id)
        return engine_class(spec.algorithm).from_state(spec, unpack_state(blob))

    def checkin(self, model_id: str, version: int, engine: Unlearner) -> None:
        """Return an engine after its transaction committed at ``version``."""
        with self._lock:
            self._cache[model_id] = (version, engine)
            self._cache.move_to_end(model_id)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)

    def evict(self, model_id: str) -> None:
        with self._lock:
            self._cache.pop(model_id, None)

    def dump(self, engine: Unlearner, model_id: str | None = None) -> bytes:
        """The engine state as the blob to store: sealed with the cipher, bound to ``model_id``."""
        blob = pack_state(engine.state())
        if self.cipher is None:
            return blob
        if model_id is None:
            raise TypeError("dump() needs the model id to seal the state (it is the AES-GCM AAD)")
        return self.cipher.seal(blob, "state", model_id)
