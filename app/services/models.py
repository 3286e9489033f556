"""The use cases on models, one service each over one shared core (app/services/model_core.py):

    lifecycle.py   ModelLifecycle  create, get, list, delete; erasure with the model or its tenant
    learning.py    Learning        learn, retrain
    forgetting.py  Forgetting      unlearn
    prediction.py  Prediction      predict, parameters
    audit.py       AuditQueries    ledger, deletion log, receipts, checkpoints, consistency, export, record status
    evaluation.py  Evaluation      evaluate (on predict's path), the last evaluation

``ModelService`` builds them over one core and holds them (``.lifecycle``, ``.learning``, ``.forgetting``,
``.prediction``, ``.audit``); each route module calls the service of its use case.  For callers that run several
use cases (the tests, the benchmarks), ``ModelService.<method>`` also answers for the service that has it.
Nothing here branches on algorithm names: the engine supplies behaviour, constants and accounting.
"""
from __future__ import annotations

from typing import Any

from ..db.session import Database
from ..registry import ModelRegistry
from .audit import AuditQueries
from .evaluation import Evaluation
from .forgetting import Forgetting
from .learning import Learning
from .lifecycle import ModelLifecycle
from .model_core import ERASED, ModelCore, class_indices, numeric_guard  # noqa: F401 - re-exported
from .prediction import Prediction
from .receipts import ReceiptIssuer


class ModelService:
    def __init__(self, db: Database, registry: ModelRegistry, issuer: ReceiptIssuer, settings, metrics=None):
        self.core = ModelCore(db, registry, issuer, settings, metrics)
        self.lifecycle = ModelLifecycle(self.core)
        self.learning = Learning(self.core)
        self.forgetting = Forgetting(self.core)
        self.prediction = Prediction(self.core)
        self.audit = AuditQueries(self.core)
        self.evaluation = Evaluation(self.core, self.prediction)  # on predict's path (issue 39)

    def __getattr__(self, name: str) -> Any:
        """A use case's method by name (``models.learn`` is ``models.learning.learn``), else the shared core's
        attribute (``records``, ``gates``, ``registry`` ...).  Only reached for names not set on the instance."""
        if name.startswith("__") or "core" not in self.__dict__:
            raise AttributeError(name)
        for service in (self.lifecycle, self.learning, self.forgetting, self.prediction, self.audit, self.evaluation):
            if hasattr(type(service), name):  # (the shared helpers resolve on the first: one core)
                return getattr(service, name)
        return getattr(self.core, name)

