"""Settings from the environment (prefix ``OLU_``).  Only ``create_app`` reads them."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OLU_", extra="ignore")

    def __init__(self, **values):
        # OLU_SECRETS_DIR: a directory of files named after the variables (OLU_ADMIN_TOKEN, OLU_ENCRYPTION_KEY, ...,
        # any case), as container secrets are mounted (/run/secrets): a secret there never shows in the process's
        # environment nor in `docker inspect`.  The environment wins where both give one.
        values.setdefault("_secrets_dir", os.environ.get("OLU_SECRETS_DIR") or None)
        super().__init__(**values)

    data_dir: Path = Field(Path("./var"), description="Database (SQLite default) and signing keys live here.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite:///<data_dir>/olu.db")
    admin_token: SecretStr | None = Field(None, description="Bearer token for tenant and key administration.")
    signing_key: SecretStr | None = Field(None, description="Ed25519 private key (PEM or base64 raw seed).")
    signing_key_file: Path | None = Field(None, description="Path to an Ed25519 private key (PEM).")
    encryption_key: SecretStr | None = Field(
        None, description="AES-256-GCM key (base64 of 32 bytes) sealing secret state at rest; "
                          "default: generated on first start into <data_dir>/encryption.key (mode 0600).")
    encryption_keys_old: SecretStr | None = Field(
        None, description="Comma-separated older encryption keys, used only to decrypt blobs sealed before a rotation.")
    auto_migrate: bool = Field(True, description="Run Alembic migrations to head at start-up.")
    sqlite_synchronous: str = Field("FULL", description="SQLite PRAGMA synchronous (FULL = durable commits).")
    log_level: str = Field("INFO", description="Level of the JSON logs on stderr.")
    # limits
    max_body_bytes: int = Field(32 * 1024 * 1024, description="Largest accepted request body.")
    max_batch: int = Field(10_000, description="Most examples (or ids) in one learn/unlearn/predict call.")
    max_dim: int = Field(100_000, description="Largest model dimension.")
    max_request_work: float = Field(
        3e9, gt=0, allow_inf_nan=False,
        description="Work one request of a model may take, in work units (one unit is about one nanosecond of one "
                    "core of the reference machine; app/unlearning/maths/work_budget.py).  At creation the service estimates, "
                    "from the spec alone, the worst case of a learn of max_batch examples, a forget of one record "
                    "and an exact retrain, and refuses (422 naming the field and its accepted range) a spec over it.")
    max_request_memory: int = Field(
        1 << 30, ge=1 << 20,
        description="Bytes the largest array of one request may take (a dense p x p Newton system and LAPACK's copy "
                    "of it included); checked at creation like max_request_work.")
    state_log: bool = Field(
        True, description="Store a learn of a model whose state is large (64 KiB or more) as a sealed delta (the "
                          "batch, or the changed pages) instead of the whole state, folded into a new full state by "
                          "every forget and retrain and once the log passes half the state's size (issue 36; "
                          "docs/operations.md §7); false: every write stores the whole state.")
    blas_threads: int = Field(
        1, ge=0,
        description="Threads of the BLAS libraries (OpenBLAS) in this process, set at start-up: 1 (default) runs "
                    "every product and factorisation on the request's own thread, as the deterministic solves must "
                    "anyway; more threads spin between calls (OpenBLAS's workers wait busily for ~0.1 s after each "
                    "threaded call or thread-count change), which cost an exact_ridge forget at D = 1 025 ~180 ms "
                    "of CPU on a 2-core machine.  0: the library's own count (OPENBLAS_NUM_THREADS, else the cores).")
    max_retained_records: int = Field(
        1_000_000, ge=1,
        description="The largest retained-record cap (hyperparameters.max_records) the service fills in for a "
                    "model that keeps its records, when the budget allows more.")
    rate_limit: float | None = Field(
        1000.0, description="Requests per second per API key (in-process token bucket: per replica); empty or 0: off.")
    rate_limit_burst: float | None = Field(None, description="Bucket size; default: the rate (one second's worth).")
    # per-tenant fair sharing (app/api/fairness.py, shared_limits.py): every key of a tenant shares these; 0: off
    tenant_rate_limit: float = Field(
        200.0, ge=0, allow_inf_nan=False,
        description="Requests per second per tenant, over all its keys (one token bucket: over the deployment on "
                    "PostgreSQL, per process otherwise; OLU_TENANT_LIMITS_SCOPE); "
                    "beyond it 429 rate-limited (limit tenant-requests) with Retry-After; 0: off.")
    tenant_rate_limit_burst: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="The tenant request bucket's size; default: the rate.")
    tenant_max_in_flight: int = Field(
        4, ge=0, description="Requests of one tenant in flight at once (over the deployment on PostgreSQL, per "
                             "process otherwise; OLU_TENANT_LIMITS_SCOPE); beyond it 429 rate-limited "
                             "(limit tenant-concurrency); 0: off.")
    tenant_compute_share: float = Field(
        1.0, ge=0, allow_inf_nan=False,
        description="Server time one tenant's requests may occupy, in request-seconds per second (the average number "
                    "of its requests in flight): its bucket drains by the requests in flight and refills at this "
                    "rate; an empty bucket is 429 rate-limited (limit tenant-compute); 0: off.")
    tenant_compute_burst_seconds: float = Field(
        2.0, ge=0, allow_inf_nan=False,
        description="The compute bucket's size in request-seconds (a burst above the share that long).")
    tenant_refusal_delay: float = Field(
        0.5, ge=0, le=10, allow_inf_nan=False,
        description="Seconds a tenant-limit refusal is held back before it is answered (at most its Retry-After), "
                    "so that a client retrying at once costs a few refusals per second per connection; 0: at once.")
    tenant_limits_scope: Literal["auto", "process", "deployment"] = Field(
        "auto", description="Where the tenant request and in-flight limits hold: 'process' (each replica allows them "
                            "in full), 'deployment' (every replica draws from the database, PostgreSQL only; "
                            "app/api/shared_limits.py), 'auto': deployment on PostgreSQL, process on SQLite (one "
                            "process). The compute share is always per process.")
    tenant_limit_lease_seconds: float = Field(
        0.05, gt=0, le=1, allow_inf_nan=False,
        description="With the deployment scope: a replica draws this many seconds of the tenant's request rate from "
                    "the shared bucket at once (at least one request, at most the burst), so it asks the database "
                    "once per lease, not per request; a lease unspent for 1 s is dropped.")
    compute_slots: int | None = Field(
        None, ge=0,
        description="Computations (the worker-thread part of learn, unlearn and large predictions) running at once "
                    "in a process; more wait in per-tenant queues served round robin, so one tenant's queue does not "
                    "delay another's requests (app/api/fairness.py FairScheduler); default: the CPUs the process may "
                    "use, at least 2 (one tenant holds at most all but one); 0: off (no queue, only the thread pool).")
    decode_process_bytes: int = Field(
        1 << 20, ge=0,
        description="Request bodies larger than this (bytes) are decoded and validated in a separate process (a "
                    "pool of decode_processes), from the worker thread holding the tenant's turn: decoding a large "
                    "body is one long C call that holds the GIL, and stalled every other tenant's requests (issue "
                    "37, F5-G; app/api/decode_pool.py). With the pool on, a hashed model's evaluate bodies and its "
                    "predict bodies too large for the event loop are also decoded and hashed there whatever their "
                    "size, and the commitments of 1 000 ids or more computed there; 0: no pool, all of it in this "
                    "process.")
    decode_processes: int = Field(
        2, ge=1, le=64, description="Processes of the decode pool (started at the first large body).")
    gil_switch_interval: float = Field(
        0.001, ge=0, le=1, allow_inf_nan=False,
        description="Seconds a thread may hold the GIL while another waits for it (sys.setswitchinterval; Python's "
                    "default is 0.005): the event loop, which answers the small requests, waits at most this long "
                    "behind a computing worker thread at each step of a request; 0: left as it is.")
    gc_freeze: bool = Field(
        True, description="Move the objects loaded at start-up (and again once the compiled kernels have loaded) out "
                          "of the cyclic garbage collector's full passes (gc.freeze, app/gc_pauses.py): each pass "
                          "otherwise walked ~200 000 objects and stopped every request for ~100 ms.")
    # per-tenant quotas (app/services/quotas.py); the admin sets them per tenant (PUT /v1/tenants/{id}/quotas)
    tenant_max_models: int = Field(
        100, ge=0, description="Default quota: live models per tenant; 0: no limit.")
    tenant_max_records: int = Field(
        10_000_000, ge=0, description="Default quota: records held (learned, not forgotten) per tenant; 0: no limit.")
    tenant_max_bytes: int = Field(
        1 << 30, ge=0, description="Default quota: bytes the tenant's data occupies (states, retained examples, "
                                   "record index; an estimate from byte lengths); 0: no limit.")
    tenant_max_audit_bytes: int = Field(
        4 << 30, ge=0, description="Default quota: bytes of the tenant's audit trail (receipts, log nodes, "
                                   "forgotten and erased records' commitments, ledger entries, checkpoints, deleted "
                                   "models' rows; an estimate from byte lengths), which nothing frees; once spent, "
                                   "learns and model creations are refused, never forgets or deletions; 0: no limit.")
    auth_failure_limit: int = Field(
        100, ge=0, description="Failed authentications (a bearer token that is neither the admin token nor a live "
                               "key) one client address may make in a burst; beyond it the address gets 429 until "
                               "its bucket refills (per process); 0: off.")
    auth_failure_window: float = Field(
        60.0, gt=0, allow_inf_nan=False,
        description="Seconds in which an address's failure bucket refills completely (limit per window).")
    trusted_proxies: str = Field(
        "", description="Comma-separated IP addresses and CIDR blocks of the reverse proxies whose forwarded header "
                        "names the client (OLU_FORWARDED_HEADER); empty: none, every client is its socket address.")
    forwarded_header: str = Field(
        "x-forwarded-for", description="The header a trusted proxy sets: x-forwarded-for or forwarded (RFC 7239).")
    auth_failure_max_addresses: int = Field(
        100_000, ge=1, description="Most client addresses whose failures are tracked (about 100 bytes each).")
    record_index_max_entries: int | None = Field(
        None, ge=0, description="Learned records whose commitment lookups this process keeps in memory (16 bytes "
                                "each), over all models; beyond it the least recently used models' indexes are "
                                "dropped and rebuilt from the database when next used (app/db/record_batches.py).  "
                                "Default: an eighth of the memory the process may use (its cgroup's limit, else the "
                                "machine's), in entries, at least 4 000 000 (64 MB); each worker process holds its "
                                "own.  0: only the index of the model in use is kept.")
    request_deadline_seconds: float = Field(
        10.0, ge=0, allow_inf_nan=False,
        description="Longest computation of one learn, unlearn or retrain (and longest wait for an earlier one on the "
                    "same model); beyond it the request answers 503 request-deadline-exceeded and changes nothing "
                    "(the abandoned computation's result is discarded); 0: no deadline.")
    auth_cache_seconds: float = Field(
        1.0, ge=0, le=60, description="Seconds a successful API key check is reused in this process; a key revoked "
                                      "through another replica or the CLI is still accepted here for at most this "
                                      "long (revoking through this process applies at once); 0: off.")
    idempotency_stale_seconds: float = Field(
        300.0, gt=0, allow_inf_nan=False,
        description="Seconds after which an Idempotency-Key claim whose request never answered (its process died) "
                    "is taken over by a retry; until then the retry answers 409 idempotency-request-in-progress. "
                    "Keep it above the longest request (OLU_REQUEST_DEADLINE_SECONDS plus database waits); a live "
                    "request whose claim is taken over commits nothing (fenced).")
    idempotency_retention_seconds: float = Field(
        86_400.0, gt=0, allow_inf_nan=False,
        description="Seconds an Idempotency-Key row (its keyed fingerprint and stored answer) is kept: a retry within "
                    "it gets the first answer; after it the key is free again and the row is deleted (each process "
                    "purges expired rows at most once a minute while it serves requests with keys). Keep it above "
                    "OLU_IDEMPOTENCY_STALE_SECONDS and the longest a client retries.")

    # long work run as operations (app/services/operations.py, docs/operations.md "Operations")
    operation_workers: int = Field(
        1, ge=0, description="Operations (long retrains, bulk unlearns, large learns: 202 Accepted) this process runs "
                             "at once; 0: it runs none (another replica or `olu operations work` does).")
    operation_lease_seconds: float = Field(
        30.0, ge=1, le=3600, allow_inf_nan=False,
        description="How long a process's claim on a running operation lasts without a heartbeat (it renews it every "
                    "third of that); a process that died loses it and another replica takes the operation over.")
    operation_poll_seconds: float = Field(
        1.0, gt=0, le=60, allow_inf_nan=False,
        description="Seconds between two looks of a process for operations to run (queued, or whose lease expired).")
    operation_deadline_seconds: float = Field(
        3600.0, ge=0, allow_inf_nan=False,
        description="Longest computation of one step of an operation (a whole retrain, one batch of a bulk unlearn "
                    "or of a large learn), instead of OLU_REQUEST_DEADLINE_SECONDS; beyond it the operation fails "
                    "(operation-deadline-exceeded) with nothing of that step applied; 0: no deadline.")
    operation_max_attempts: int = Field(
        3, ge=1, le=100,
        description="Leases an operation may take (the first run and each take-over after a process died); an "
                    "operation whose lease expires after the last fails (operation-abandoned), nothing half-applied.")

    @field_validator("rate_limit", "rate_limit_burst", mode="before")
    @classmethod
    def _empty_is_none(cls, v):
        return None if isinstance(v, str) and not v.strip() else v

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'olu.db').resolve()}"
