"""Model specifications (bounds, privacy target, feature dictionaries) and the model view.  Field names are part of the contract (API.md)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel

from .rules import SOFTMAX_FIELDS, SOME_FEATURE_FIELD, UNIQUE, json_int, key_names

from .feature_map import FeatureMapSpec, ServedFeatureMap
from .common import (UtcDatetime, Finite, POSITIVE_NORMAL_MIN, PositiveFinite, _zero_or_normal, NO_CONTROL, LossName, MAX_CLASSES, ClassName, _OmitNone, Strict)


# ---- models ----------------------------------------------------------------------------------------------
class Bounds(Strict):
    x_norm: PositiveFinite = Field(description="Largest accepted L2 norm of a feature vector.")
    y_abs: PositiveFinite = Field(1.0, description="Largest accepted |label| (squared and huber losses).")


class PrivacyTarget(Strict):
    epsilon: PositiveFinite = Field(1.0, description="Target epsilon of the (epsilon, delta) guarantee.")
    delta: float = Field(1e-6, ge=1e-300, lt=1, strict=True, description="Target delta (at least 1e-300: log(1/delta) must be finite).")


# ---- feature dictionaries (app/features.py) ----------------------------------------------------------------
FieldName = Annotated[str, Field(min_length=1, max_length=128, pattern=NO_CONTROL)]
CategoryValue = Annotated[str, Field(max_length=1024)]
FeatureValue = Finite | CategoryValue | Annotated[list[CategoryValue], Field(max_length=1000)] | None


class FeatureDict(RootModel[Annotated[dict[str, FeatureValue], Field(max_length=1000)]]):
    """A feature dictionary: declared numeric fields as numbers, declared categorical fields as a string or a list
    of strings; null or absent fields contribute nothing. Encoded by the model's hashed feature spec."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"country": "FR", "age": 31, "tags": ["a", "b"]}]})


class FeatureSpec(Strict):
    """Feature dictionaries hashed into the model's dim buckets (docs/features.md)."""
    model_config = ConfigDict(extra="forbid", json_schema_extra=SOME_FEATURE_FIELD)
    type: Literal["hashed"] = Field(description="hashed: strings and list items hash to signed buckets "
                                                "(MurmurHash3 x64 128, fixed public seed).")
    dim: json_int(ge=1) = Field(description="Number of buckets: must equal the model's dim.")
    numeric: dict[FieldName, Annotated[list[Finite], Field(min_length=2, max_length=2)]] = Field(
        default_factory=dict, max_length=1000, json_schema_extra=key_names(NO_CONTROL, 1, 128), description="Numeric fields, each with its declared range [lo, hi] (lo < hi): a value "
                                          "is scaled to 2 (v - lo) / (hi - lo) - 1, never by statistics of the data.")
    categorical: list[FieldName] = Field(default_factory=list, max_length=1000, json_schema_extra=UNIQUE, description=(
        "Categorical fields: each value a string, or a list of strings (one token per item)."))
    out_of_range: Literal["refuse", "clip"] = Field("refuse", description=(
        "A numeric value outside its range: refuse (422 out-of-range-feature) or clip it to the range."))
    unknown_fields: Literal["refuse", "ignore"] = Field("refuse", description=(
        "A field not declared here: refuse (422 unknown-feature) or ignore it."))


class ServedFeatureSpec(FeatureSpec):
    hash: str = Field(description="The hash function (murmurhash3_x64_128).")
    seed: int = Field(description="Its fixed public seed.")


class ModelCreate(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra=SOFTMAX_FIELDS)
    name: str = Field(min_length=1, max_length=200, pattern=NO_CONTROL)
    algorithm: str = Field("passive_olu", description="Model family; see GET /v1/algorithms.")
    loss: LossName | None = Field(None, description=(
        "The loss; absent or null: the family's default loss (GET /v1/algorithms `default_loss`: logistic, or "
        "squared for exact_ridge, which serves only least squares)."))
    dim: json_int(ge=1) = Field(description="Number of features.")
    bounds: Bounds
    domain_radius: PositiveFinite = Field(10.0, description="Parameters live in the L2 ball of this radius.")
    l2: Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False), AfterValidator(_zero_or_normal)] = Field(
        0.01, json_schema_extra={"anyOf": [{"const": 0}, {"minimum": POSITIVE_NORMAL_MIN}]},
        description="L2 regularisation (mu): 0 or a positive normal float.")
    privacy: PrivacyTarget = Field(default_factory=PrivacyTarget)
    hyperparameters: dict[str, Any] = Field(default_factory=dict, description=(
        "Family-specific knobs, each with a default (some families require a few, e.g. online_dp_tree's horizon). "
        "Each family's JSON Schema (names, types, defaults, ranges, descriptions, when each applies) is served by "
        "GET /v1/algorithms and is in this document as components/schemas/Hyperparameters_<algorithm>, linked by "
        "algorithm from x-hyperparameters; an unknown name is a 422 listing the accepted ones and the closest."))
    n_classes: json_int(ge=2, le=MAX_CLASSES) | None = Field(None, description=(
        "loss softmax, or loss squared with a least-squares classifier (exact_ridge): the number of classes K "
        "(labels 0..K-1); may be omitted when classes is given."))
    classes: list[ClassName] | None = Field(None, min_length=2, max_length=MAX_CLASSES, json_schema_extra=UNIQUE,
                                            description=(
        "loss softmax (or squared, exact_ridge): distinct class names, in label order; learn and predict then also "
        "take and give names."))
    features: FeatureSpec | None = Field(None, description=(
        "Accept feature dictionaries instead of dense vectors: hashed into dim buckets, then scaled down to "
        "bounds.x_norm. Absent: examples are dense vectors x."))
    feature_map: FeatureMapSpec | None = Field(None, description=(
        "A public feature map: the model learns, forgets and predicts on phi(x) of the raw dense rows x (dim values "
        "each, scaled and clipped as declared); the engine's dimension is feature_map.centres and bounds.x_norm is "
        "served as the map's bound, min(1, x_norm). Nothing in the map depends on data."))


# The public constants are served as a map {L, beta, mu, D} (API.md).  It is typed as a map of numbers
# rather than an object with a field "D", because openapi-python-client's generated parser shadows its own
# local variable ``d`` with a field of that name and breaks.
# A constant that counts (exact_ridge's record_cap, up to 2^53 - 1) is an integer, never a float (issue 37 item 8).
Constants = Annotated[dict[str, int | float], Field(
    description="Public constants derived from the declared bounds: L (Lipschitz constant of the loss on the "
                "domain), beta (smoothness), mu (strong convexity), D (diameter of the domain); families may "
                "add more, e.g. restart_prefix: how many first steps after creation or a restart are not covered "
                "by the noise analysis, so that forgetting one of them restarts the model (exact); record_cap "
                "(exact_ridge): the most records the model holds, an integer.", examples=[{"L": 1.51, "beta": 0.51, "mu": 0.01, "D": 20.0}])]


LEDGER_DETAILS = Field(default_factory=dict, description=(
    "Family-specific public ledger numbers, each a function of the specification and of public counts only "
    "(docs/receipts.md), e.g. the memory pair's counts and worst-case sample complexity (n_inserts, n_active, "
    "sample_complexity, inference_allowed), rewind's m_max capacity, descent-to-delete's per-round epsilon."))


class LedgerSummary(BaseModel):
    accounting: str
    rho_spent: float | None
    rho_budget: float | None
    epsilon: float = Field(description="Epsilon spent so far at the model's delta.")
    delta: float | None
    capacity_left: int | None = None
    details: dict[str, Any] = LEDGER_DETAILS


class Guarantee(BaseModel):
    definition: str
    statement: str


class Model(_OmitNone):
    _omit = ("n_classes", "classes", "feature_map")
    id: str
    name: str
    algorithm: str
    loss: str
    dim: int
    bounds: Bounds
    domain_radius: float
    l2: float
    privacy: PrivacyTarget
    hyperparameters: dict[str, Any]
    features: ServedFeatureSpec | None = None
    feature_map: ServedFeatureMap | None = None
    created_at: UtcDatetime
    status: Literal["ready", "retrain_required"]
    step: int | None = Field(description="Records learned so far (each record's step counts them); null for a model "
                                         "whose published versions are private with respect to each record's "
                                         "presence (exact_ridge with publication private), whose counts are withheld.")
    n_records: int | None = Field(description="Records learned; null where counts are withheld (see step).")
    n_forgotten: int | None = Field(description="Records forgotten; null where counts are withheld (see step).")
    version: int
    epoch: int
    constants: Constants
    ledger_summary: LedgerSummary
    guarantee: Guarantee
    n_classes: int | None = Field(None, description="Classifiers only (softmax, least squares): the number of classes K.")
    classes: list[str] | None = Field(None, description="Classifiers with declared class names only.")


class ModelList(BaseModel):
    items: list[Model]
    next_cursor: str | None
