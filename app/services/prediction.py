"""Prediction: predict from the published parameters, and the published parameters themselves.

A service of its own over the shared ``ModelCore`` (app/services/model_core.py); the route modules call it.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import Problem
from ..registry import (loss_for, published_array, spec_from_json)
from .model_core import (UseCase, _PREDICT_COLUMNS)


class Prediction(UseCase):
    INLINE_PREDICT_VALUES = 65_536  # larger prediction requests are computed on a worker thread

    def predict_inline(self, X: list[list[float]]) -> bool:
        """Whether ``predict(..., inline=True)`` may run on the event loop: on SQLite (one indexed read of the
        model row on this thread's own connection, ~0.1 ms; a WAL reader never waits for a writer) and for
        small inputs.  It saves the worker-thread hop (0.35-0.5 ms of a ~2 ms predict on this project's machine);
        PostgreSQL reads go over the network and keep the hop."""
        return self.db.is_sqlite and sum(len(row) for row in X) <= self.INLINE_PREDICT_VALUES

    def predict(self, tenant_id: str, model_id: str, X: list[list[float]] | None, inline: bool = False,
                features: list | None = None) -> dict[str, Any]:
        self._check_batch(len(X) if X is not None else len(features or ()))
        # one prebuilt Core query of the columns a prediction needs
        with (self.db.own_read() if inline else self.db.read_connection()) as conn:
            found = conn.execute(_PREDICT_COLUMNS, {"mid": model_id, "tid": tenant_id}).first()
        if found is None:
            raise Problem(404, "model-not-found", f"No model {model_id}.")
        version = found[0]
        published = self._published.get((model_id, version))
        if published is None:  # decoded once per (model, version): a version never changes once written
            ledger = json.loads(found[3])
            spec = spec_from_json(found[1])
            gate = None
            if ledger.get("inference_allowed") is False:
                gate = (f"The model answers predictions once it has learned {ledger.get('sample_complexity')} "
                        f"examples (it has {ledger.get('n_inserts')}); its inference gate is on.")
            theta = published_array(found[2])
            theta.setflags(write=False)  # shared by later requests
            published = (spec, theta, loss_for(spec), gate)
            if len(self._published) >= 1024:
                self._published.clear()
            self._published[(model_id, version)] = published
        spec, theta, loss, gate = published
        dim = spec.dim
        if gate is not None:
            raise Problem(409, "inference-not-ready", gate)
        if spec.features is not None or features is not None:
            X = self._encode(spec, X, features, examples=False)
        if any(len(row) != dim for row in X):  # ragged rows would make numpy raise (was a 500)
            raise Problem(422, "invalid-dimension", f"Each feature vector must have {dim} values.")
        Xa = np.asarray(X, dtype=np.float64)
        if Xa.ndim != 2 or Xa.shape[1] != dim:
            raise Problem(422, "invalid-dimension", f"Each feature vector must have {dim} values.")
        if loss.n_out > 1:  # softmax: K scores per input (losses.py)
            return self._predict_classes(loss, theta, Xa, spec.classes, version)
        with np.errstate(over="ignore", invalid="ignore"):
            scores = Xa @ theta[:-1] + theta[-1]
        if not np.all(np.isfinite(scores)):  # would not serialise as JSON (was a 500)
            raise Problem(422, "out-of-bounds-input", "Feature values too large to score.")
        return {"predictions": loss.predict(scores).tolist(), "scores": loss.score_output(scores).tolist(),
                "version": version}

    @staticmethod
    def _predict_classes(loss, theta, Xa, names, version: int) -> dict[str, Any]:
        """Softmax: the class index (and name, if declared), its probability and all K class probabilities."""
        with np.errstate(over="ignore", invalid="ignore"):
            scores = loss.linear_scores(theta, Xa)
            probs = loss.score_output(scores) if np.all(np.isfinite(scores)) else scores
        if not np.all(np.isfinite(probs)):
            raise Problem(422, "out-of-bounds-input", "Feature values too large to score.")
        pred = np.argmax(probs, axis=1)
        out = {"predictions": pred.astype(np.float64).tolist(),
               "scores": probs[np.arange(len(pred)), pred].tolist(), "version": version,
               "probabilities": probs.tolist()}
        if names is not None:
            out["classes"] = [names[k] for k in pred.tolist()]
        return out

    def parameters(self, tenant_id: str, model_id: str) -> dict[str, Any]:
        with self.db.read() as s:
            row = self._row(s, tenant_id, model_id)
        theta = published_array(row.published)
        if not np.all(np.isfinite(theta)):  # never served as null weights (stored before the finite guard)
            raise Problem(409, "non-finite-result", "The model's stored parameters are not finite numbers; "
                                                    "retrain or delete the model.")
        spec = json.loads(row.spec_json)
        if spec.get("n_classes"):  # K outputs (stored for softmax only): the K x (d + 1) matrix, row-major (losses.py)
            return {"version": row.version, "weights": theta.tolist(), "bias": None,
                    "published_at": row.published_at, "shape": [spec["n_classes"], spec["dim"] + 1],
                    "classes": spec.get("classes")}
        return {"version": row.version, "weights": theta[:-1].tolist(), "bias": float(theta[-1]),
                "published_at": row.published_at}
