"""Evaluation: how good a model is now, on labelled examples the client sends (issue 39).

Built on prediction's path (``Prediction.predict``: the same decoding, encoding, checks and published parameters), so
an evaluation counts exactly what predict answers.  It learns nothing, and keeps nothing of the examples: only the
aggregate figures of the model's last evaluation are stored (``models.last_evaluation``), for the console and GET
/v1/models/{id}/evaluation.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
from sqlalchemy import select, update

from ..db.tables import Model
from ..errors import Problem
from ..ids import iso, utcnow
from ..registry import loss_for, spec_from_json
from ..schemas.evaluation import MAX_CONFUSION_CLASSES
from ..unlearning import InputError
from .model_core import UseCase, class_indices

LOG_LOSS_FLOOR = 1e-15  # p(true class) is clipped below here (as scikit-learn's log_loss): a finite mean
PROBABILISTIC = ("logistic", "softmax")  # the losses whose scores are probabilities (app/unlearning/maths/losses.py)


class Evaluation(UseCase):
    def __init__(self, core, prediction):
        super().__init__(core)
        self.prediction = prediction

    def evaluate(self, tenant_id: str, model_id: str, X: list | None, features: list | None,
                 y: list) -> dict[str, Any]:
        n = len(X) if X is not None else len(features or ())
        self._check_batch(n)
        if len(y) != n:
            raise Problem(422, "validation-error", f"y must hold one label per input ({n}), not {len(y)}.",
                          errors=[{"loc": ["body", "y"], "msg": "one label per input", "type": "value_error"}])
        spec = self._spec(tenant_id, model_id)
        loss = loss_for(spec)
        labels = self._labels(spec, loss, y)
        answer = self.prediction.predict(tenant_id, model_id, X, features=features)  # predict's own checks and path
        pred = np.asarray(answer["predictions"], dtype=np.float64)
        out: dict[str, Any] = {"n": n, "version": answer["version"]}
        if spec.n_classes or loss.name == "logistic":
            K = spec.n_classes or 2
            hit = pred == labels
            out["correct"] = int(np.count_nonzero(hit))
            out["accuracy"] = out["correct"] / n
            if K <= MAX_CONFUSION_CLASSES:
                cm = np.zeros((K, K), dtype=np.int64)
                np.add.at(cm, (labels.astype(np.int64), pred.astype(np.int64)), 1)
                out["confusion_matrix"] = cm.tolist()
            if loss.name in PROBABILISTIC:
                if answer.get("probabilities") is not None:
                    P = np.asarray(answer["probabilities"], dtype=np.float64)
                    p_true = P[np.arange(n), labels.astype(np.int64)]
                else:  # logistic: the score is the class-1 probability
                    p1 = np.asarray(answer["scores"], dtype=np.float64)
                    p_true = np.where(labels == 1.0, p1, 1.0 - p1)
                out["log_loss"] = float(np.mean(-np.log(np.clip(p_true, LOG_LOSS_FLOOR, 1.0))))
            if spec.classes:
                out["classes"] = list(spec.classes)
        else:
            out["mean_squared_error"] = float(np.mean((pred - labels) ** 2))
        out["evaluated_at"] = utcnow()
        self._keep(tenant_id, model_id, out)
        return out

    def last(self, tenant_id: str, model_id: str) -> dict[str, Any]:
        with self.db.read() as s:
            found = s.execute(select(Model.last_evaluation).where(
                Model.id == model_id, Model.tenant_id == tenant_id, Model.status != "deleted")).first()
        if found is None:
            raise Problem(404, "model-not-found", f"No model {model_id}.")
        return {"evaluation": None if found[0] is None else json.loads(found[0])}

    def _spec(self, tenant_id: str, model_id: str):
        with self.db.read_connection() as conn:
            found = conn.execute(select(Model.spec_json).where(
                Model.id == model_id, Model.tenant_id == tenant_id, Model.status != "deleted")).first()
        if found is None:
            raise Problem(404, "model-not-found", f"No model {model_id}.")
        return spec_from_json(found[0])

    @staticmethod
    def _labels(spec, loss, y: list) -> np.ndarray:
        """The true labels as floats: class names become indices; a classifier's labels must be its classes (422
        invalid-label naming the example), a regression's any finite number."""
        y = class_indices(spec, y)
        labels = np.asarray(y, dtype=np.float64)
        if spec.n_classes or loss.name == "logistic":
            try:
                labels = loss.normalize_labels(labels)
            except InputError as e:
                raise Problem(422, "invalid-label", str(e), index=e.index) from None
        return labels

    def _keep(self, tenant_id: str, model_id: str, figures: dict[str, Any]) -> None:
        """Store the aggregate figures as the model's last evaluation (nothing of the examples)."""
        stored = {**figures, "evaluated_at": iso(figures["evaluated_at"])}
        with self.db.write() as s:
            s.execute(update(Model).where(Model.id == model_id, Model.tenant_id == tenant_id,
                                          Model.status != "deleted").values(last_evaluation=json.dumps(stored)))
