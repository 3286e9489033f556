"""SQLAlchemy 2.0 tables.  The schema changes only through Alembic migrations (migrations/)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import (BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, MetaData,
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
    quota_audit_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # 0017 (issue 37, F5-A)
    # live models, records held and bytes stored: in TenantUsageShard (0019; app/db/usage_shards.py)
    # what the tenant's forgets, deletions and checkpoints left for audit, never decreasing (app/services/audit_usage.py)
    usage_audit_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


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
    # records an exact restart discarded (the model keeps nothing of them) and not forgotten since, and the last
    # step such a restart dropped: records held are n_records - n_forgotten - n_dropped (app/services/dropped.py)
    n_dropped: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    dropped_through: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # the aggregate figures of the model's last evaluation (app/services/evaluation.py): never an example
    last_evaluation: Mapped[str | None] = mapped_column(Text, nullable=True)
    __table_args__ = (Index("ix_models_tenant_created", "tenant_id", "created_at", "id"),)


class ModelState(Base):
    """The secret state's base: the engine's named arrays in one sealed blob, as of ``version`` (the model's version,
    or an earlier one whose later changes are the ``model_state_deltas`` rows after it).  Never served."""

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
    """A state-changing request made with an Idempotency-Key: its fingerprint and, once done, its answer.  Kept for
    OLU_IDEMPOTENCY_RETENTION_SECONDS (app/services/idempotency.py)."""

    __tablename__ = "idempotency_keys"
    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    # HMAC-SHA256(tenant fingerprint key, SHA-256 of method, path, body) (0017: was the bare SHA-256); "" once a
    # record the request carried was forgotten (the model's deletion too)
    request_hash: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(12))  # in_progress | done
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # the fencing token of the request that holds the claim (a take-over draws a new one); completing checks it
    claim: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # an answered learn: its model and the steps of the records its body carried (forgetting one erases the hash)
    model_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    first_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    __table_args__ = (Index("ix_idempotency_keys_model_steps", "model_id", "last_step"),
                      Index("ix_idempotency_keys_created_at", "created_at"))


class ModelStateDelta(Base):
    """What one version changed in a model's secret state (issue 36 item 1): the state at version v is the base
    (``model_states``, at its own version) with the deltas of the versions after it applied in order
    (app/db/state_log.py).  ``kind``: "learn" (the batch the engine learned, which it re-learns exactly) or "patch"
    (the changed pages of the packed state).  Sealed under its own data key (``model_state_delta_keys``); every
    forget, retrain or compaction folds the log into a new base and deletes these rows in its transaction."""

    __tablename__ = "model_state_deltas"
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(8))
    sealed: Mapped[bytes] = mapped_column(LargeBinary)  # nonce | AES-256-GCM(delta key, packed delta) | tag


class ModelStateDeltaKey(Base):
    """The data key of one state delta, wrapped by the service's encryption key; deleted with the delta."""

    __tablename__ = "model_state_delta_keys"
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary)  # Cipher.seal(key, "state-delta-key", "<model>:<version>")


class RetainedChunk(Base):
    """Examples kept for a data-holding family, sealed together (issue 36 item 2; app/db/retained.py): the records
    of one public group (the engine's ``retained_groups``: sisa's shard) in step order.  A forget rewrites its
    chunk without the record under a fresh key and deletes this row and its key."""

    __tablename__ = "retained_chunks"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # random; part of the AES-GCM AAD
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"))
    grp: Mapped[int] = mapped_column(BigInteger)
    first_step: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int] = mapped_column(BigInteger)
    n: Mapped[int] = mapped_column(Integer)
    steps: Mapped[bytes] = mapped_column(LargeBinary)  # n x int64 little-endian, ascending (public step indices)
    # nonce | AES-256-GCM(chunk key, X as n x d little-endian float64 | y as n float64) | tag
    sealed: Mapped[bytes] = mapped_column(LargeBinary)
    __table_args__ = (Index("ix_retained_chunks_model_grp_last", "model_id", "grp", "last_step"),)


class RetainedChunkKey(Base):
    """The data key of one retained chunk, wrapped by the service's encryption key.  Deleted with its chunk when a
    forget rewrites the chunk: crypto-shredding (app/db/retained.py)."""

    __tablename__ = "retained_chunk_keys"
    chunk_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), index=True)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary)  # Cipher.seal(chunk key, "retained-chunk-key", "<model>:<id>")


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
    # HMAC-SHA256(tenant fingerprint key, SHA-256 of the message) (0017: was the bare SHA-256; the column keeps its
    # name): a reused event id with another body is refused; "" once a record the event carried was forgotten, and
    # at once for an unlearn event that resent features
    body_sha256: Mapped[str] = mapped_column(String(64))
    version: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # model version after it (applied)
    result: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    first_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # an applied learn's records' steps
    last_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    __table_args__ = (Index("ix_stream_events_model_steps", "model_id", "last_step"),)


class StreamCursor(Base):
    """Per stream and model subject, the last stream sequence taken into account: the order guard that lets
    several consumer processes share one durable consumer (app/streaming/consumer.py)."""

    __tablename__ = "stream_cursors"
    stream: Mapped[str] = mapped_column(String(255), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger)


class Operation(Base):
    """Long work run as an operation (issue 36 item 4; app/services/operations.py): a retrain, a bulk unlearn or a
    large learn, run by whichever replica holds its lease; ``fence`` is the holder's token (a take-over draws a new
    one) and every commit of the operation is a conditional update on it."""

    __tablename__ = "operations"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    model_id: Mapped[str] = mapped_column(String(40))  # kept after the model is deleted
    kind: Mapped[str] = mapped_column(String(16))  # retrain | unlearn | learn
    status: Mapped[str] = mapped_column(String(12))  # queued | running | succeeded | failed | cancelled
    done: Mapped[int] = mapped_column(BigInteger, default=0)
    total: Mapped[int] = mapped_column(BigInteger, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # leases taken (a take-over counts)
    owner: Mapped[str | None] = mapped_column(String(80), nullable=True)  # the process that holds the lease
    fence: Mapped[str | None] = mapped_column(String(32), nullable=True)  # its fencing token
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # the data key of the sealed request (operation_payloads), wrapped by the service's encryption key; NULL once
    # the operation has ended (crypto-shredding: the payload can no longer be opened)
    wrapped_key: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    result: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON: what was committed so far
    problem: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON: the RFC 9457 problem of a failure
    __table_args__ = (Index("ix_operations_tenant_id", "tenant_id", "id"),
                      Index("ix_operations_status_lease", "status", "lease_until"))


class OperationPayload(Base):
    """One chunk of an operation's request (commitments of record ids, examples), sealed under the operation's data
    key; deleted when the chunk is applied and all of them when the operation ends."""

    __tablename__ = "operation_payloads"
    operation_id: Mapped[str] = mapped_column(ForeignKey("operations.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    sealed: Mapped[bytes] = mapped_column(LargeBinary)  # nonce | AES-256-GCM(data key, chunk, AAD) | tag


class OperationReceipt(Base):
    """The receipt of the record at position ``idx`` of a bulk unlearn, written in the transaction that forgot it."""

    __tablename__ = "operation_receipts"
    operation_id: Mapped[str] = mapped_column(ForeignKey("operations.id"), primary_key=True)
    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    receipt_id: Mapped[str] = mapped_column(String(40))


class TenantUsageShard(Base):
    """A slice of a tenant's usage counters (0019, issue 37 item 6): live models, records held and bytes stored of
    the tenant's models whose id hashes to this shard, and the shard's slice of the remaining quota (``cap_*``,
    computed for the limits in ``basis``); app/db/usage_shards.py."""
    __tablename__ = "tenant_usage_shards"
    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    models: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    records: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cap_models: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cap_records: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cap_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    basis: Mapped[str] = mapped_column(String(80), default="", server_default="")


class TenantRateBucket(Base):
    """A tenant's request bucket shared by every replica (0019, issue 37 item 5; app/api/shared_limits.py): tokens
    left at ``updated_at`` (seconds, the database's clock)."""
    __tablename__ = "tenant_rate_buckets"
    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class TenantSlot(Base):
    """In-flight slots of a tenant held by one replica until ``expires_at`` (the database's clock), renewed while
    the replica lives (0019; app/api/shared_limits.py)."""
    __tablename__ = "tenant_slots"
    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    replica: Mapped[str] = mapped_column(String(40), primary_key=True)
    slots: Mapped[int] = mapped_column(Integer)
    expires_at: Mapped[float] = mapped_column(Float)
