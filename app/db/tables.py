"""SQLAlchemy 2.0 tables.  The schema changes only through Alembic migrations (migrations/)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import (BigInteger, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, MetaData,
                        String, Text, UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    record_key: Mapped[bytes] = mapped_column(LargeBinary)  # HMAC key for record commitments; never served
    log_size: Mapped[int] = mapped_column(BigInteger, default=0)  # per-tenant append-only receipt counter
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # set by DELETE /v1/tenants/{id}: keys revoked, every model erased with an erasure receipt; the log stays
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # quotas set by the admin (PUT /v1/tenants/{id}/quotas); NULL: the deployment's default; 0: no limit
    quota_models: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    quota_records: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    quota_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # usage the quotas check, kept by every write in its own transaction (delta updates; app/services/quotas.py):
    # live models, records held (n_records - n_forgotten) and bytes_stored summed over the tenant's live models
    usage_models: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    usage_records: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    usage_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    prefix: Mapped[str] = mapped_column(String(32), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))  # SHA-256 hex of the whole key
    scopes: Mapped[str] = mapped_column(String(64))  # space-separated
    label: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Model(Base):
    __tablename__ = "models"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    algorithm: Mapped[str] = mapped_column(String(40))
    spec_json: Mapped[str] = mapped_column(Text)  # the immutable public spec (with calibrated rho)
    status: Mapped[str] = mapped_column(String(20))  # ready | retrain_required | deleted
    step: Mapped[int] = mapped_column(BigInteger, default=0)
    n_records: Mapped[int] = mapped_column(BigInteger, default=0)
    n_forgotten: Mapped[int] = mapped_column(BigInteger, default=0)
    version: Mapped[int] = mapped_column(BigInteger, default=0)
    epoch: Mapped[int] = mapped_column(Integer, default=1)
    rho_spent: Mapped[float] = mapped_column(Float, default=0.0)
    ledger_json: Mapped[str] = mapped_column(Text, default="{}")  # the engine's public ledger() after the last write
    constants_json: Mapped[str] = mapped_column(Text, default="{}")  # public constants L, beta, mu, D
    guarantee_json: Mapped[str] = mapped_column(Text, default="{}")  # the instance's guarantee wording
    published: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # float64 LE weights + bias
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # the bytes the model's data occupies (state, records held, retained examples; app/services/quotas.py)
    bytes_stored: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # the aggregate figures of the model's last evaluation (app/services/evaluation.py): never an example
    last_evaluation: Mapped[str | None] = mapped_column(Text, nullable=True)
    __table_args__ = (Index("ix_models_tenant_created", "tenant_id", "created_at", "id"),)


class ModelState(Base):
    """The secret state: the engine's named arrays in one blob.  Never served."""

    __tablename__ = "model_states"
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger)
    blob: Mapped[bytes] = mapped_column(LargeBinary)


class RecordBatch(Base):
    """The records one learn request added, packed into one row: index ``i`` of each blob is the batch's i-th
    example.  Writing a batch is one row insert; a per-record row with a commitment index dirtied about one index
    page per record (docs/performance.md §2).  Commitments are found through a per-process in-memory index of their
    first 8 bytes (app/db/record_batches.py) that catches up on the batches of a model by ``id`` order.  The row is
    kept small (steps only when they are not consecutive): on PostgreSQL each large value is a TOAST write."""

    __tablename__ = "record_batches"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(40))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"))
    n: Mapped[int] = mapped_column(Integer)
    # n x 32 bytes: HMAC-SHA256(tenant record key, record id), the only form in which record ids are stored
    commitments: Mapped[bytes] = mapped_column(LargeBinary)
    first_step: Mapped[int] = mapped_column(BigInteger)  # the step that learned record 0
    # n x int64 little-endian, the step that learned each record; NULL when they are first_step, first_step + 1, ...
    steps: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # n x 32 bytes, HMAC of each example's bytes, kept only for families whose clients send features to unlearn;
    # a forgotten record's 32 bytes are overwritten with zeros
    example_macs: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    learned_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    __table_args__ = (Index("ix_record_batches_model_id", "model_id", "id"),)


class Record(Base):
    """A forgotten record (learned records live only in ``record_batches``): when and by which receipt."""

    __tablename__ = "records"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(40))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"))
    commitment: Mapped[str] = mapped_column(String(64))  # HMAC-SHA256(tenant record key, record id), hex
    # the commitment's first 8 bytes as a signed 64-bit integer: the only index on commitments (see lookup_key)
    lookup: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int] = mapped_column(BigInteger)
    # forgotten (unlearned; 0007 moved learned records to record_batches), or erased (with its model, 0009):
    # then receipt_id is the model's erasure receipt and forgotten_at the time of the erasure
    status: Mapped[str] = mapped_column(String(12))
    learned_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    forgotten_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    receipt_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    example_mac: Mapped[str | None] = mapped_column(String(64), nullable=True)  # unused since 0007 (always NULL)
    __table_args__ = (
        # one narrow integer index answers every lookup (model, tenant); rows are matched on the full commitment
        Index("ix_records_lookup", "lookup"),
        Index("ix_records_model_step", "model_id", "step"),
    )


class Receipt(Base):
    __tablename__ = "receipts"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    model_id: Mapped[str] = mapped_column(String(40))  # kept after the model is deleted
    log_index: Mapped[int] = mapped_column(BigInteger)
    # certificate: the forgotten record's commitment; model_erasure: the receipt's records.sha256
    record_commitment: Mapped[str] = mapped_column(String(64))
    body: Mapped[bytes] = mapped_column(LargeBinary)  # canonical JSON of the signed receipt
    kind: Mapped[str] = mapped_column(String(16), default="certificate")  # certificate | model_erasure
    issued_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    __table_args__ = (
        UniqueConstraint("tenant_id", "log_index", name="uq_receipts_tenant_log_index"),
        Index("ix_receipts_model_log_index", "model_id", "log_index"),
        Index("ix_receipts_tenant_commitment", "tenant_id", "record_commitment"),
    )


class LedgerEntry(Base):
    __tablename__ = "ledger_entries"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    model_id: Mapped[str] = mapped_column(String(40), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    receipt_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    kind: Mapped[str] = mapped_column(String(20))  # deletion | restart | retrain
    step: Mapped[int] = mapped_column(BigInteger)
    sigma: Mapped[float] = mapped_column(Float)
    rho: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class IdempotencyRecord(Base):
    """A state-changing request made with an Idempotency-Key: its fingerprint and, once done, its answer."""

    __tablename__ = "idempotency_keys"
    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(12))  # in_progress | done
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # the fencing token of the request that holds the claim (a take-over draws a new one); completing checks it
    claim: Mapped[str | None] = mapped_column(String(32), nullable=True)


class RetainedExample(Base):
    """An example kept for a data-holding family.  Deleted (not flagged) when its record is forgotten."""

    __tablename__ = "retained_examples"
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    # nonce | AES-256-GCM(own data key, x and y as little-endian float64) | tag (app/db/retained.py)
    sealed: Mapped[bytes] = mapped_column(LargeBinary)


class RetainedKey(Base):
    """The data key of one retained example, wrapped by the service's encryption key.  Deleted with the example
    when its record is forgotten: crypto-shredding (app/db/retained.py)."""

    __tablename__ = "retained_keys"
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary)  # Cipher.seal(data key, "retained-key", "<model>:<step>")


class MerkleNode(Base):
    """RFC 6962 tree of a tenant's receipt log: the root of each complete perfect subtree, written once."""

    __tablename__ = "merkle_nodes"
    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    hash: Mapped[bytes] = mapped_column(LargeBinary)


class Checkpoint(Base):
    """A signed tree head of a tenant's log, one per tree size the service has signed."""

    __tablename__ = "checkpoints"
    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tree_size: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    body: Mapped[str] = mapped_column(Text)  # the checkpoint JSON as served
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class StreamEvent(Base):
    """A broker event (``olu consume``, docs/streaming.md) taken into account: applied, or dead-lettered.

    Written in the same transaction as the learn / unlearn it applies, so an event id is recorded exactly when its
    effect is; ``result`` is the message published back (compact learn acknowledgement, the forget's signed
    receipts, or the dead letter's problem), re-published as is when the event is delivered again."""

    __tablename__ = "stream_events"
    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    model_id: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))  # learn | unlearn | other (malformed)
    outcome: Mapped[str] = mapped_column(String(16))  # applied | dead_letter
    stream: Mapped[str] = mapped_column(String(255))
    seq: Mapped[int] = mapped_column(BigInteger)  # the stream sequence it was recorded from
    body_sha256: Mapped[str] = mapped_column(String(64))  # a reused event id with another body is refused
    version: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # model version after it (applied)
    result: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class StreamCursor(Base):
    """Per stream and model subject, the last stream sequence taken into account: the order guard that lets
    several consumer processes share one durable consumer (app/streaming/consumer.py)."""

    __tablename__ = "stream_cursors"
    stream: Mapped[str] = mapped_column(String(255), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger)
