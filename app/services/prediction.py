"""Prediction: predict from the published parameters, and the published parameters themselves.

A service of its own over the shared ``ModelCore`` (app/services/model_core.py); the route modules call it.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import Problem
from ..feature_map import check_count, encode as map_encode
from ..features import FeatureError, HashedRows, chunk_rows, dense_rows, dense_width, sparse_rows
from ..registry import (loss_for, published_array, spec_from_json)
from ..unlearning import InputError, engine_class
from .model_core import (UseCase, _PREDICT_COLUMNS, _PREDICT_VERSION, feature_problem)


class NotInline(Exception):
    """Raised by ``Prediction.predict(inline=True)`` before any encoding when the request's real size (rows x the
    model's dense width) is above what the event loop answers itself: the caller runs it on a worker instead."""


class Prediction(UseCase):
    # Larger prediction requests are decoded (INLINE_BODY_BYTES) and computed (INLINE_PREDICT_VALUES) on a worker
    # thread in the tenant's turn (app/api/models.py predict). Measured in the fairness bench (issue 29): a 100-row
    # predict at d = 64 (6 400 values, 130 kB) held the event loop 2.4 ms at the median and 7 ms at p90 under a
    # flood, and another tenant's 1-row predicts waited behind it (5-10 ms before their request was read).
    INLINE_PREDICT_VALUES = 1_024
    INLINE_BODY_BYTES = 4_096  # 16 KiB before: 1 000 hashed rows' JSON (13 KB) was parsed and validated on the loop (~1 ms)
    INLINE_HASHED_ROWS = 64  # a hashed row's tokens are hashed in Python (~5 us each): 64 rows, ~0.3 ms on the loop

    def __init__(self, core):
        super().__init__(core)
        self._hashed_specs: dict[tuple[str, str], tuple[dict, float] | None] = {}  # hashed_spec, per model

    def predict_inline(self, X: list[list[float]]) -> bool:
        """Whether ``predict(..., inline=True)`` may run on the event loop: on SQLite (one indexed read of the
        model row on this thread's own connection, ~0.1 ms; a WAL reader never waits for a writer) and for
        small inputs.  It saves the worker-thread hop (0.35-0.5 ms of a ~2 ms predict on this project's machine);
        PostgreSQL reads go over the network and keep the hop."""
        return self.db.is_sqlite and sum(len(row) for row in X) <= self.INLINE_PREDICT_VALUES

    def _lookup(self, tenant_id: str, model_id: str, inline: bool = False) -> tuple[int, tuple]:
        """(version, (spec, theta, loss, gate, family)) of the model's published parameters: prebuilt Core queries,
        the version (one indexed read), and the columns a prediction needs only for a version whose published
        parameters this process has not decoded yet (404 for no such model of the tenant)."""
        found = None
        with (self.db.own_read() if inline else self.db.read_connection()) as conn:
            version = conn.execute(_PREDICT_VERSION, {"mid": model_id, "tid": tenant_id}).scalar()
            published = None if version is None else self._published.get((model_id, version))
            if published is None:  # the columns, published parameters included, only for a version not cached
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
            published = (spec, theta, loss_for(spec), gate, engine_class(spec.algorithm))
            if len(self._published) >= 1024:
                self._published.clear()
            self._published[(model_id, version)] = published
        return version, published

    def hashed_spec(self, tenant_id: str, model_id: str) -> tuple[dict, float] | None:
        """(feature spec, x_norm) when the model scores feature dictionaries as sparse hashed rows (a feature spec,
        no feature map), so that a large body's dictionaries may be hashed where it is decoded (the decode pool:
        app/api/decode_pool.py); else None.  A model's spec never changes, so the answer is kept per model: only a
        model's first large predict or evaluate reads it (404 for no such model, not kept)."""
        known = self._hashed_specs.get((tenant_id, model_id), False)
        if known is not False:
            return known
        spec = self._lookup(tenant_id, model_id)[1][0]
        hashed = (spec.features, spec.x_norm) if spec.features is not None and spec.feature_map is None else None
        if len(self._hashed_specs) >= 10_000:
            self._hashed_specs.clear()
        self._hashed_specs[(tenant_id, model_id)] = hashed
        return hashed

    def predict(self, tenant_id: str, model_id: str, X: list[list[float]] | None, inline: bool = False,
                features: "list | HashedRows | None" = None) -> dict[str, Any]:
        """Predict ``X`` (dense rows) or ``features`` (feature dictionaries, or a hashed model's dictionaries
        already hashed in the decode pool: ``HashedRows``)."""
        self._check_batch(len(X) if X is not None else len(features or ()))
        version, published = self._lookup(tenant_id, model_id, inline)
        spec, theta, loss, gate, family = published
        dim = spec.dim
        if gate is not None:
            raise Problem(409, "inference-not-ready", gate)
        encoded = spec.features is not None or spec.feature_map is not None or features is not None
        n = len(X) if X is not None else len(features or ())
        if features is not None and spec.features is not None and spec.feature_map is None:
            if inline and n > self.INLINE_HASHED_ROWS:
                raise NotInline  # hashing each row's tokens is Python work: beyond a few rows, a worker's
            return self._answer(*self._score(family, spec, loss, theta, self._sparse(spec, features)), spec, loss,
                                version)
        if inline and encoded and n * dense_width(spec) > self.INLINE_PREDICT_VALUES:
            raise NotInline  # its real size (rows x the hashed dim) is not the loop's: the route moves it to a worker
        # encoded and scored in chunks of at most CHUNK_BYTES of dense rows (issue 37, F5-F): a hashed row is
        # dim values once encoded, so 1 000 dictionaries of a few bytes each at dim 10^5 would be 800 MB at once
        try:
            check_count(spec.feature_map, n)  # the whole request's rows, before its chunks
        except FeatureError as e:
            raise feature_problem(e, examples=False) from None
        step = chunk_rows(max(dense_width(spec), dim))
        preds, outs = [], []
        for a in range(0, n, step):
            Xa = self._rows(spec, None if X is None else X[a : a + step],
                            None if features is None else features[a : a + step], encoded, a)
            pred, out = self._score(family, spec, loss, theta, Xa)
            preds.append(pred)
            outs.append(out)
            del Xa
        if not preds:  # no input at all: scored as one empty chunk, as before
            pred, out = self._score(family, spec, loss, theta, self._rows(spec, X, features, encoded, 0))
        else:
            pred, out = (preds[0], outs[0]) if len(preds) == 1 else (np.concatenate(preds), np.concatenate(outs))
        return self._answer(pred, out, spec, loss, version)

    @staticmethod
    def _score(family, spec, loss, theta, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """(predictions, outputs) of inputs ``X`` (dense rows, or a hashed model's sparse rows)."""
        try:  # the family's own reading of its published parameters (one model, or an ensemble's mean)
            return family.predict_published(spec, loss, theta, X)
        except InputError as e:  # scores that would not serialise as JSON (was a 500)
            raise Problem(422, e.code, str(e)) from None

    def _answer(self, pred, out, spec, loss, version: int) -> dict[str, Any]:
        if out.ndim == 2:  # softmax: K probabilities per input (losses.py)
            return self._predict_classes(pred, out, spec.classes, version)
        # labels (logistic 0/1) are integers, as the model learned them; values (squared, huber) are numbers
        labels = pred.astype(np.int64).tolist() if loss.predicts_labels else pred.tolist()
        return {"predictions": labels, "scores": out.tolist(), "version": version}

    @staticmethod
    def _sparse(spec, features: "list | HashedRows") -> Any:
        """A hashed model's feature dictionaries as sparse rows (features.sparse_rows): a prediction scores only
        their tokens, whatever the hashed dim (issue 37, F5-F), on the loop or a worker alike; rows hashed already
        (in the decode pool) are taken as they are, once they are seen to be this spec's."""
        if isinstance(features, HashedRows):
            return features.for_spec(spec.features, spec.x_norm)
        try:
            return sparse_rows(spec.features, features, spec.x_norm)
        except FeatureError as e:
            raise feature_problem(e, examples=False) from None

    def _rows(self, spec, X: list | None, features: list | None, encoded: bool, offset: int) -> np.ndarray:
        """One chunk of a request's inputs as the (rows, dim) float64 array the family scores; a refusal names the
        input by its place in the whole request (``offset`` + its place in the chunk)."""
        dim = spec.dim
        if encoded:
            try:
                X = map_encode(spec.feature_map, dense_rows(spec.features, spec.x_norm, X, features), fixed=False)
            except FeatureError as e:
                if e.index is not None:
                    e.index += offset
                raise feature_problem(e, examples=False) from None
        if any(len(row) != dim for row in X):  # ragged rows would make numpy raise (was a 500)
            raise Problem(422, "invalid-dimension", f"Each feature vector must have {dim} values.")
        Xa = np.asarray(X, dtype=np.float64)
        if Xa.ndim != 2 or Xa.shape[1] != dim:
            raise Problem(422, "invalid-dimension", f"Each feature vector must have {dim} values.")
        return Xa

    @staticmethod
    def _predict_classes(pred, probs, names, version: int) -> dict[str, Any]:
        """Softmax: the class index (and name, if declared), its probability and all K class probabilities."""
        index = pred.astype(np.int64)
        out = {"predictions": index.tolist(), "scores": probs[np.arange(len(index)), index].tolist(),
               "version": version, "probabilities": probs.tolist()}
        if names is not None:
            out["classes"] = [names[k] for k in index.tolist()]
        return out

    def parameters(self, tenant_id: str, model_id: str) -> dict[str, Any]:
        with self.db.read() as s:
            row = self._row(s, tenant_id, model_id)
        theta = published_array(row.published)
        if not np.all(np.isfinite(theta)):  # never served as null weights (stored before the finite guard)
            raise Problem(409, "non-finite-result", "The model's stored parameters are not finite numbers; "
                                                    "retrain or delete the model.")
        spec = spec_from_json(row.spec_json)
        family = engine_class(spec.algorithm)
        shape = list(family.published_shape(spec))
        if len(shape) > 1:  # a matrix (softmax: K x (d + 1); an ensemble: its members first), row-major
            return {"version": row.version, "weights": theta.tolist(), "bias": None,
                    "published_at": row.published_at, "shape": shape, "classes": spec.classes and list(spec.classes),
                    "ensemble": family.published_ensemble(spec)}
        return {"version": row.version, "weights": theta[:-1].tolist(), "bias": float(theta[-1]),
                "published_at": row.published_at}
