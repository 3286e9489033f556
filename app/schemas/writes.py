"""Learn, unlearn and predict: requests and answers.  Field names are part of the contract (API.md)."""
from __future__ import annotations

from typing import ClassVar, Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .rules import EXAMPLE_SHAPE, PREDICT_SHAPE, UNIQUE

from .common import (UtcDatetime, Finite, RecordId, ClassName, _OmitNone, Strict)
from .models import (FeatureDict)
from .receipts import (Receipt)


# ---- learn / unlearn / predict -------------------------------------------------------------------------
class Example(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra=EXAMPLE_SHAPE)  # exactly one of x or features
    id: RecordId
    x: list[Finite] | None = Field(None, description="The feature vector (dense models).")
    features: FeatureDict | None = Field(None, description="The feature dictionary (models with a feature spec).")
    y: Finite | ClassName = Field(description="The label: 0/1 (logistic), a real target (squared, huber), or a "
                                              "class index 0..K-1 or declared class name (softmax).")


ONE_SHAPE = "give exactly one of x (dense models) or features (models with a feature spec)"


def _one_shape_each(examples: list[Example] | None) -> None:
    """Each example carries x or features, not both, not neither (checked once per list: a validator per example
    cost ~1 us each on the learn path)."""
    for i, e in enumerate(examples or ()):
        if (e.x is None) == (e.features is None):
            raise ValueError(f"examples[{i}]: {ONE_SHAPE}")


class LearnRequest(Strict):
    examples: list[Example] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_shape(self):
        _one_shape_each(self.examples)
        return self


class LearnColumnarRequest(Strict):
    """The columnar learn body: one id, one feature vector and one label per example, in order (decoded straight
    into arrays; also accepted as application/msgpack, where x and y may be raw little-endian float64 bytes)."""

    ids: list[RecordId] = Field(min_length=1, json_schema_extra=UNIQUE)
    x: list[list[Finite]] = Field(description="Feature vectors, one per id, each of the model's dimension.")
    y: list[Finite] = Field(description="Labels, one per id.")


class StepRange(BaseModel):
    first_step: int
    last_step: int


class LearnResponse(_OmitNone):
    _omit = ("restart_on_forget",)
    accepted: int
    first_step: int
    last_step: int
    version: int
    restart_on_forget: StepRange | None = Field(
        None, description="Present when forgetting some of the records just learned will restart the model: the "
                          "range of their steps.  The noise analysis of the model's schedule does not cover them "
                          "(the first constants.restart_prefix steps after creation or a restart), so their forget "
                          "discards everything the model learned and starts again from its initial state (an exact "
                          "forget; the receipt's mechanism says restart).")


class UnlearnRequest(Strict):
    # what an Idempotency-Key's fingerprint leaves out (app/api/idempotent.py): resent features are never kept
    UNFINGERPRINTED: ClassVar[set[str]] = {"examples"}
    ids: list[RecordId] = Field(min_length=1, json_schema_extra=UNIQUE)
    examples: list[Example] | None = Field(
        None, description="The forgotten records' features and labels, for models that keep no data but need them "
                          "to forget (memory_pair and exact_ridge with deletion_features=client); checked against what was "
                          "learned.")

    @model_validator(mode="after")
    def _one_shape(self):
        _one_shape_each(self.examples)
        return self

    def resent(self) -> list[tuple] | None:
        """The resent examples as the forget takes them: (id, x, y, feature dictionary), or None when none."""
        return ([(e.id, e.x, e.y, None if e.features is None else e.features.root) for e in self.examples]
                if self.examples else None)


class UnlearnResponse(BaseModel):
    receipts: list[Receipt]
    version: int


class RetrainResponse(BaseModel):
    version: int
    epoch: int


class PredictRequest(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra=PREDICT_SHAPE)  # exactly one of x or features
    x: Annotated[list[list[Finite]], Field(min_length=1)] | None = Field(
        None, description="Feature vectors (dense models).")
    features: Annotated[list[FeatureDict], Field(min_length=1)] | None = Field(
        None, description="Feature dictionaries (models with a feature spec).")

    @model_validator(mode="after")
    def _one_shape(self):
        if (self.x is None) == (self.features is None):
            raise ValueError(ONE_SHAPE)
        return self

    def feature_dicts(self) -> list | None:
        """The feature dictionaries as plain dicts, or None for dense inputs."""
        return None if self.features is None else [f.root for f in self.features]


class PredictResponse(_OmitNone):
    _omit = ("probabilities", "classes")
    predictions: list[int | float] = Field(description=(
        "Per input: the label, an integer (logistic 0 or 1; softmax, or a least-squares classifier, the class "
        "index), or the predicted value, a number (squared, huber)."))
    scores: list[float] = Field(description="Per input: the class-1 probability (logistic), the predicted class's "
                                            "probability (softmax), or the raw score.")
    version: int
    probabilities: list[list[float]] | None = Field(
        None, description="Softmax models only: per input, the K class probabilities.")
    classes: list[str] | None = Field(
        None, description="Softmax models with declared class names only: the predicted class name per input.")


class Parameters(_OmitNone):
    _omit = ("shape", "classes", "ensemble")
    version: int
    weights: list[float] = Field(description="The weights; softmax: the K x (d + 1) matrix in row-major order "
                                             "(row k = class k's d weights, then its bias); an ensemble (sisa): "
                                             "its members' parameters one after the other, each as above.")
    bias: float | None = Field(description="The bias; null where `shape` is given (each row of the matrix ends with "
                                           "its bias).")
    published_at: UtcDatetime | None
    shape: list[int] | None = Field(None, description="Softmax models: [K, d + 1]; ensembles (sisa): the number of "
                                                      "members first, [S, d + 1] or [S, K, d + 1].")
    classes: list[str] | None = Field(None, description="Softmax models with declared class names only.")
    ensemble: str | None = Field(None, description="Ensembles only (sisa): how predictions combine the members: "
                                                   "`mean_output`, the mean of their outputs (class-1 probability, "
                                                   "class probabilities or value), then the label or class of that "
                                                   "mean.")
