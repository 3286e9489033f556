"""Evaluate a model on labelled examples (POST /v1/models/{id}/evaluate) and its last evaluation (issue 39)."""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from .common import ClassName, Finite, UtcDatetime, _OmitNone
from .writes import PredictRequest

MAX_CONFUSION_CLASSES = 50


class EvaluateRequest(PredictRequest):
    """A predict request's inputs (exactly one of x or features, as for predict) and one true label per input."""
    y: Annotated[list[Finite | ClassName], Field(min_length=1)] = Field(description=(
        "One true label per input: 0/1 (logistic), a class index 0..K-1 or declared class name (classifiers), a real "
        "target (regression)."))


class Evaluation(_OmitNone):
    """The figures that apply to the model (the others are left out)."""
    _omit = ("accuracy", "correct", "log_loss", "mean_squared_error", "confusion_matrix", "classes")
    n: int = Field(description="The number of examples evaluated.")
    version: int = Field(description="The model version whose published parameters were evaluated.")
    accuracy: float | None = Field(None, description="Classifiers: correct / n.")
    correct: int | None = Field(None, description="Classifiers: the number of examples whose predicted class is "
                                                  "the true one (what predict answers, counted).")
    log_loss: float | None = Field(None, description=(
        "Models with probabilities (logistic, softmax): the mean of -ln p(true class), p clipped below at 1e-15. "
        "Not given for a least-squares classifier, whose scores are no probabilities."))
    mean_squared_error: float | None = Field(None, description="Regression: the mean of (prediction - y)^2.")
    confusion_matrix: list[list[int]] | None = Field(None, description=(
        f"Classifiers of at most {MAX_CONFUSION_CLASSES} classes: counts, row = true class, column = predicted class "
        "(class index order)."))
    classes: list[str] | None = Field(None, description="The declared class names, in class index order.")
    evaluated_at: UtcDatetime


class LastEvaluation(BaseModel):
    evaluation: Evaluation | None = Field(description=(
        "The figures of the model's last evaluation (aggregates only: no example is kept), or null if none."))
