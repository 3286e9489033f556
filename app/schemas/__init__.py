"""Pydantic request/response models: the public contract, mirrored in openapi/openapi.json.

One module per area (common, tenants, models, writes, receipts, audit, system); import from the package."""
from .common import (  # noqa: F401
    UtcDatetime, Finite, POSITIVE_NORMAL_MIN, PositiveFinite, _zero_or_normal, NO_CONTROL, RecordId, Scope,
    LossName, MAX_CLASSES, ClassName, _OmitNone, Strict)
from .tenants import (  # noqa: F401
    TenantCreate, ModelErasedRef, TenantDeleted, TenantCreated, KeyCreate, KeyCreated, PublicKey, PublicKeys,
    QuotaSet, QuotaNumbers, QuotaOverrides, Usage, TenantView)
from .models import (  # noqa: F401
    Bounds, PrivacyTarget, FieldName, CategoryValue, FeatureValue, FeatureDict, FeatureSpec, ServedFeatureSpec,
    ModelCreate, Constants, LEDGER_DETAILS, LedgerSummary, Guarantee, Model, ModelList)
from .receipts import (  # noqa: F401
    Mechanism, ReceiptGuarantee, LedgerAfter, SignedCheckpoint, ReceiptProof, Receipt, ErasureGuarantee,
    ErasedRecords, ErasureReceipt, DELETION_MARK_DOC)
from .writes import (  # noqa: F401
    Example, ONE_SHAPE, _one_shape_each, LearnRequest, LearnColumnarRequest, StepRange, LearnResponse,
    UnlearnRequest, UnlearnResponse, RetrainResponse, PredictRequest, PredictResponse, Parameters)
from .audit import (  # noqa: F401
    LedgerEntryOut, Ledger, ReceiptList, DeletionLog, RecordModelStatus, RecordStatus, ConsistencyProof,
    ErasureEvidence, ExportBundle)
from .system import (Problem, Health, Algorithm, AlgorithmList)  # noqa: F401
