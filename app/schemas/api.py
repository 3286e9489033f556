"""Request and response shapes of API.md.  Field names are part of the contract."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel, model_serializer, model_validator

from .rules import EXAMPLE_SHAPE, PREDICT_SHAPE, SOFTMAX_FIELDS, SOME_FEATURE_FIELD, UNIQUE, json_int, key_names

# SQLite returns naive datetimes even for DateTime(timezone=True) columns: every stored time is UTC, say so
# (an RFC 3339 date-time needs the offset)
UtcDatetime = Annotated[datetime, AfterValidator(lambda d: d if d.tzinfo else d.replace(tzinfo=timezone.utc))]
# Numbers are strict: a JSON number (an integer is fine), never a boolean or a numeric string.
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
# Positive numbers of a model spec are positive *normal* floats: a subnormal (below 2.2250738585072014e-308) has lost
# precision already, so 1e-320 and 5e-324 are refused alike; each family's calibration check decides the real range.
POSITIVE_NORMAL_MIN = 2.2250738585072014e-308  # sys.float_info.min
PositiveFinite = Annotated[float, Field(ge=POSITIVE_NORMAL_MIN, strict=True, allow_inf_nan=False)]


def _zero_or_normal(v: float) -> float:
    if 0.0 < v < POSITIVE_NORMAL_MIN:
        raise ValueError(f"must be 0 or at least {POSITIVE_NORMAL_MIN!r} (a normal float)")
    return v


# Ids and names never carry control characters (C0 and DEL): they end up in logs, receipts and databases
# (PostgreSQL refuses NUL in text).
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
RecordId = Annotated[str, Field(min_length=1, max_length=256, pattern=NO_CONTROL,
                                description="The client's record id (no control characters).")]
Scope = Literal["write", "predict", "audit"]
LossName = Literal["logistic", "squared", "huber", "softmax"]
MAX_CLASSES = 1000  # app/unlearning/maths/losses.py MAX_CLASSES
ClassName = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_CONTROL,
                                 description="A declared class name of a softmax model.")]


class _OmitNone(BaseModel):
    """Optional fields added for softmax models are left out of the JSON when they do not apply, so the answers
    for the other losses are unchanged."""

    _omit: tuple[str, ...] = ()

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):
        out = handler(self)
        for key in self._omit:
            if out.get(key) is None:
                out.pop(key, None)
        return out


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- tenants and keys ---------------------------------------------------------------------------------
class TenantCreate(Strict):
    name: str = Field(min_length=1, max_length=200, pattern=NO_CONTROL)


class ModelErasedRef(BaseModel):
    model_id: str
    erasure_receipt_id: str


class TenantDeleted(BaseModel):
    """What DELETE /v1/tenants/{id} did: every live model erased (one erasure receipt each), every key revoked."""

    tenant_id: str
    deleted_at: UtcDatetime
    models_erased: list[ModelErasedRef]
    keys_revoked: int


class TenantCreated(BaseModel):
    id: str
    name: str
    api_key: str = Field(description="Shown once; carries the write, predict and audit scopes.")


class KeyCreate(Strict):
    scopes: list[Scope] = Field(min_length=1, max_length=3)
    label: str | None = Field(None, max_length=200, pattern=NO_CONTROL)


class KeyCreated(BaseModel):
    id: str
    api_key: str = Field(description="Shown once.")
    scopes: list[Scope]
    label: str | None = None


class PublicKey(BaseModel):
    key_id: str
    alg: Literal["Ed25519"] = "Ed25519"
    public_key: str = Field(description="Base64 of the raw 32-byte Ed25519 public key.")
    status: str = "active"
    not_before: str | None = None
    not_after: str | None = None


class PublicKeys(BaseModel):
    keys: list[PublicKey]


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
    """Feature dictionaries hashed into the model's dim buckets (README "Feature dictionaries")."""
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
    loss: LossName = "logistic"
    dim: json_int(ge=1) = Field(description="Number of features.")
    bounds: Bounds
    domain_radius: PositiveFinite = Field(10.0, description="Parameters live in the L2 ball of this radius.")
    l2: Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False), AfterValidator(_zero_or_normal)] = Field(
        0.01, json_schema_extra={"anyOf": [{"const": 0}, {"minimum": POSITIVE_NORMAL_MIN}]},
        description="L2 regularisation (mu): 0 or a positive normal float.")
    privacy: PrivacyTarget = Field(default_factory=PrivacyTarget)
    hyperparameters: dict[str, Any] = Field(default_factory=dict, description="Family-specific, all defaulted.")
    n_classes: json_int(ge=2, le=MAX_CLASSES) | None = Field(None, description=(
        "loss softmax: the number of classes K (labels 0..K-1); may be omitted when classes is given."))
    classes: list[ClassName] | None = Field(None, min_length=2, max_length=MAX_CLASSES, json_schema_extra=UNIQUE,
                                            description=(
        "loss softmax: distinct class names, in label order; learn and predict then also take and give names."))
    features: FeatureSpec | None = Field(None, description=(
        "Accept feature dictionaries instead of dense vectors: hashed into dim buckets, then scaled down to "
        "bounds.x_norm. Absent: examples are dense vectors x."))


# The public constants are served as a map {L, beta, mu, D} (API.md).  It is typed as a map of numbers
# rather than an object with a field "D", because openapi-python-client's generated parser shadows its own
# local variable ``d`` with a field of that name and breaks.
Constants = Annotated[dict[str, float], Field(
    description="Public constants derived from the declared bounds: L (Lipschitz constant of the loss on the "
                "domain), beta (smoothness), mu (strong convexity), D (diameter of the domain); families may "
                "add more, e.g. restart_prefix: how many first steps after creation or a restart are not covered "
                "by the noise analysis, so that forgetting one of them restarts the model (exact).", examples=[{"L": 1.51, "beta": 0.51, "mu": 0.01, "D": 20.0}])]


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
    _omit = ("n_classes", "classes")
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
    created_at: UtcDatetime
    status: Literal["ready", "retrain_required"]
    step: int
    n_records: int
    n_forgotten: int
    version: int
    epoch: int
    constants: Constants
    ledger_summary: LedgerSummary
    guarantee: Guarantee
    n_classes: int | None = Field(None, description="Softmax models only: the number of classes K.")
    classes: list[str] | None = Field(None, description="Softmax models with declared class names only.")


class ModelList(BaseModel):
    items: list[Model]
    next_cursor: str | None


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
    ids: list[RecordId] = Field(min_length=1, json_schema_extra=UNIQUE)
    examples: list[Example] | None = Field(
        None, description="The forgotten records' features and labels, for models that keep no data but need them "
                          "to forget (memory_pair with deletion_features=client); checked against what was learned.")

    @model_validator(mode="after")
    def _one_shape(self):
        _one_shape_each(self.examples)
        return self


class Mechanism(_OmitNone):
    # a receipt is returned exactly as signed: grid/rounding/restart appear only where the signed body has them
    # (exact mechanisms and receipts issued before the discrete mechanism have neither)
    _omit = ("grid", "rounding", "restart")
    type: str = Field(description="discrete_gaussian (discrete Gaussian noise on a grid, into the state) or exact "
                                  "(restart / retrain); receipts issued before the discrete mechanism say gaussian.")
    sigma: float
    sensitivity: float
    rho: float
    grid: float | None = Field(None, description="discrete_gaussian: the declared grid resolution g (a power of "
                                                 "two); the noised parameters are g times integers before any "
                                                 "projection onto the domain.")
    rounding: str | None = Field(None, description="discrete_gaussian: how the secret state was rounded onto the "
                                                   "grid (nearest_even: to nearest, ties to even).")
    restart: bool | None = Field(None, description="exact only, present (true) when this forget discarded the "
                                                   "model's whole learned state: it restarted from its initial state "
                                                   "(or, for a model that keeps its data, retrained from it on the "
                                                   "records it still holds) and a new ledger epoch began.  The "
                                                   "other records of the same request are forgotten by the same "
                                                   "restart.")


class ReceiptGuarantee(BaseModel):
    definition: str
    alpha: float | None
    epsilon: float
    delta: float | None
    conversion: str
    statement: str


class LedgerAfter(BaseModel):
    rho_spent: float
    epsilon: float
    delta: float | None
    capacity_left: int | None


class SignedCheckpoint(BaseModel):
    origin: str = Field(description="olu/<tenant_id>")
    tree_size: int
    root_hash: str = Field(description="Base64 of the RFC 6962 root hash.")
    timestamp: str
    key_id: str
    signature: str = Field(description="Ed25519 (base64) over '<origin>\\n<tree_size>\\n<root_hash>\\n<timestamp>\\n'.")


class ReceiptProof(BaseModel):
    leaf_index: int
    tree_size: int
    hashes: list[str] = Field(description="RFC 9162 audit path, leaf to root, base64.")
    checkpoint: SignedCheckpoint


class Receipt(BaseModel):
    id: str
    tenant_id: str
    model_id: str
    record_commitment: str
    learned_step: int
    forgotten_step: int
    deletion_index: int
    epoch: int
    algorithm: str
    mechanism: Mechanism
    guarantee: ReceiptGuarantee
    ledger_after: LedgerAfter
    published_parameters_sha256: str
    model_version: int
    issued_at: str
    log_index: int
    key_id: str
    signature: str = Field(description="Ed25519 over the RFC 8785 canonical JSON without signature and proof.")
    proof: ReceiptProof | None = Field(None, description="Inclusion proof against a signed checkpoint "
                                       "(on GET /v1/receipts/{id} and in export bundles).")


class ErasureGuarantee(BaseModel):
    definition: Literal["exact"]
    epsilon: float = Field(description="0: an exact forget spends no privacy budget.")
    delta: float
    statement: str


class ErasedRecords(BaseModel):
    erased: int = Field(description="How many records the model still held (learned and not forgotten before).")
    commitments_sha256: str = Field(description=(
        "Hex SHA-256 over the erased records' 32-byte commitments (HMAC-SHA256(tenant record key, record id)), "
        "sorted ascending as byte strings and concatenated; SHA-256 of the empty string when none."))


class ErasureReceipt(BaseModel):
    """The signed receipt of a model's deletion: one leaf of the tenant's log, like a certificate receipt."""

    id: str
    kind: Literal["model_erasure"]
    tenant_id: str
    model_id: str
    algorithm: str
    mechanism: Mechanism = Field(description="exact, sigma = sensitivity = rho = 0.")
    guarantee: ErasureGuarantee
    records: ErasedRecords
    records_learned: int = Field(description="Records the model ever learned.")
    records_forgotten_before: int = Field(description="Records forgotten earlier, each with its own receipt.")
    model_version: int = Field(description="The model's version after the deletion.")
    issued_at: str
    log_index: int
    key_id: str
    signature: str = Field(description="Ed25519 over the RFC 8785 canonical JSON without signature and proof.")
    proof: ReceiptProof | None = Field(None, description="Inclusion proof against a signed checkpoint "
                                       "(on GET /v1/receipts/{id} and in export bundles).")


DELETION_MARK_DOC = {
    "model_status": Field(description="live, or deleted (the model is erased; its audit trail stays readable)."),
    "deleted_at": Field(None, description="When the model was deleted."),
    "erasure_receipt_id": Field(None, description="The receipt of the model's deletion (GET /v1/receipts/{id})."),
}


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


class PredictResponse(_OmitNone):
    _omit = ("probabilities", "classes")
    predictions: list[float] = Field(description="Per input: the label (logistic 0/1, softmax the class index) or "
                                                 "the predicted value (squared, huber).")
    scores: list[float] = Field(description="Per input: the class-1 probability (logistic), the predicted class's "
                                            "probability (softmax), or the raw score.")
    version: int
    probabilities: list[list[float]] | None = Field(
        None, description="Softmax models only: per input, the K class probabilities.")
    classes: list[str] | None = Field(
        None, description="Softmax models with declared class names only: the predicted class name per input.")


class Parameters(_OmitNone):
    _omit = ("shape", "classes")
    version: int
    weights: list[float] = Field(description="The weights; softmax: the K x (d + 1) matrix in row-major order "
                                             "(row k = class k's d weights, then its bias).")
    bias: float | None = Field(description="The bias; null for softmax (each row of the matrix ends with its bias).")
    published_at: UtcDatetime | None
    shape: list[int] | None = Field(None, description="Softmax models only: [K, d + 1].")
    classes: list[str] | None = Field(None, description="Softmax models with declared class names only.")


class LedgerEntryOut(BaseModel):
    receipt_id: str | None
    kind: str
    step: int
    sigma: float
    rho: float


class Ledger(BaseModel):
    model_id: str
    epoch: int
    accounting: str
    rho_spent: float | None
    rho_budget: float | None
    epsilon: float
    delta: float | None
    conversion: str
    capacity_total: int | None
    capacity_left: int | None
    entries: list[LedgerEntryOut]
    details: dict[str, Any] = LEDGER_DETAILS
    model_status: Literal["live", "deleted"] = DELETION_MARK_DOC["model_status"]
    deleted_at: UtcDatetime | None = DELETION_MARK_DOC["deleted_at"]
    erasure_receipt_id: str | None = DELETION_MARK_DOC["erasure_receipt_id"]


class ReceiptList(BaseModel):
    items: list[Receipt]
    next_cursor: str | None


class DeletionLog(ReceiptList):
    """A model's certificate receipts (its erasure receipt, if deleted, is named, not listed)."""

    model_status: Literal["live", "deleted"] = DELETION_MARK_DOC["model_status"]
    deleted_at: UtcDatetime | None = DELETION_MARK_DOC["deleted_at"]
    erasure_receipt_id: str | None = DELETION_MARK_DOC["erasure_receipt_id"]


class RecordModelStatus(BaseModel):
    model_id: str
    status: Literal["learned", "forgotten", "erased_with_model"] = Field(description=(
        "learned; forgotten (unlearned, receipt_id is its certificate receipt); or erased_with_model (the model "
        "was deleted while it held the record: receipt_id is the model's erasure receipt, erased_at its time)."))
    step: int
    receipt_id: str | None = None
    erased_at: UtcDatetime | None = Field(None, description="Only with erased_with_model: when the model was deleted.")


class RecordStatus(BaseModel):
    record_id: str
    models: list[RecordModelStatus]


class ConsistencyProof(BaseModel):
    from_size: int
    to_size: int
    hashes: list[str] = Field(description="RFC 9162 consistency proof, base64 hashes.")
    from_checkpoint: SignedCheckpoint
    to_checkpoint: SignedCheckpoint


class ErasureEvidence(BaseModel):
    receipt: ErasureReceipt
    commitments: list[str] | None = Field(None, description=(
        "In a model's bundle: the erased records' commitments (hex, sorted), whose count and SHA-256 the verifier "
        "checks against the receipt; null in a record's bundle."))


class ExportBundle(BaseModel):
    """Everything an auditor needs to verify offline: receipts with proofs, the checkpoint, the public keys."""

    receipts: list[Receipt]
    erasures: list[ErasureEvidence] = Field(default_factory=list, description=(
        "Erasure receipts of deleted models (the model exported, or those that erased the record exported)."))
    checkpoint: SignedCheckpoint
    public_keys: list[PublicKey]


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class Algorithm(BaseModel):
    name: str
    accounting: str
    needs_retained_data: bool
    guarantee: Guarantee


class AlgorithmList(BaseModel):
    items: list[Algorithm]
