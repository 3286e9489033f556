"""The work and memory one request of a model may take, estimated from its spec alone (issue 21).

Every family answers ``Unlearner.cost(spec, batch)`` with a :class:`Cost`: the worst case of one learn request of
``batch`` examples, of one forget request of one record (and of each further record in the same request), of one
exact retrain, the largest array it allocates and the side of the largest dense matrix it hands to LAPACK.  The
service compares it with its budget at model creation (app/registry.py) and refuses what exceeds it, naming the
fields; families whose forget work grows with the records they keep take a retained-record cap
(``hyperparameters.max_records``) so that the worst case is finite.

Work is counted in *work units*: one unit is about one nanosecond of one core of the reference machine (2-core AMD
EPYC, OpenBLAS, ``OPENBLAS_NUM_THREADS=1``).  The constants below were measured there (docs/operations.md, "Work
budget"); the estimates use only public quantities (spec, hyperparameters, batch, record cap), never data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# ---- calibrated unit costs (work units; one unit ~ 1 ns of one core) ------------------------------------------------
FLOP = 1.0          # one multiply-add of a vectorised numpy kernel streaming its operands (gemv, axpy, einsum)
DENSE_FLOP = 0.1    # one flop inside a blocked BLAS-3 / LAPACK kernel (gemm, gesv)
STEP = 30_000.0     # one Python-level iteration calling a few numpy functions on small arrays (an OGD step)
CALL = 5_000.0      # one numpy call on a chunk (overhead of a chunked pass, per chunk)
RELEASE = 400.0     # one coordinate of a discrete Gaussian release (CKS20 sampler; app/unlearning/mechanism/release.py)
PURE_DRAW = 60_000.0  # one discrete Gaussian draw by the pure-Python CKS20 sampler (noise.py): the compiled kernel's
                      # int64 bounds exclude sigma'/g > 2^30.5 (fast_dgauss.route); measured 45-52 us at 2e9..1e15
FALLBACK_DRAW = RELEASE + 0.1 * PURE_DRAW  # 2^29 <= sigma'/g <= 2^30.5: a few % of draws redone by the pure path
# the retained store (app/db/retained.py) seals records in chunks of up to CHUNK_RECORDS records and CHUNK_BYTES
# bytes of rows; a read opens whole chunks (issue 36): SQLite through mmap, AES-GCM, the arrays
READ_BYTE = 1.4     # one byte of retained rows read and opened (measured 0.6-0.8 ns a byte at d = 32..1000)
CHUNK_OPEN = 60_000.0  # one chunk: its row fetched, its data key unwrapped, its arrays made
STORE = 1_500_000.0    # a request's reads of the store: its queries, each in a short read transaction
QUERY = 800_000.0      # one more look-up in the store (a group's chunk list and its chunks: two short reads)
CHUNK_RECORDS, CHUNK_BYTES = 4096, 512 << 10
READ = CHUNK_OPEN + CHUNK_BYTES * READ_BYTE  # one record read at random: the whole chunk that holds it is opened
PAGE = CHUNK_OPEN   # (kept for callers of the per-record store's page cost: one chunk)
EXACT_STEP = 60.0   # one step of the compiled exact OGD loop (mechanism/exact_ogd.py) besides its 4 p multiply-adds
FAST_STEP = 600.0   # one step of the compiled passive OGD loop (mechanism/fast.py) besides its 4 p multiply-adds
PREDICT_OUTPUT = 20.0  # one output of a prediction (exp, normalisation, the argmax or threshold)
PREDICT_CALL = 150_000.0  # a prediction call (its checks, the scores and output map of each member, in Python): 0.1-0.3 ms measured
F64 = 8             # bytes per float64
DISTRIBUTED = 1.7   # descent_to_delete distributed: measured / counted (reservoir updates, slot bookkeeping, selection)
# one multiply-add of a matrix-vector product (X theta, X^T r) over a matrix of rows held in memory: 0.24-0.41 ns
# measured while the matrix stays in cache, 0.47 (descent_to_delete's passes over 33 MB) to 0.8 ns streamed from
# memory on the loaded machine (issue 36 item 3, d = 50..1000)
GEMV_CACHED, GEMV = 0.6, 0.8
GEMV_CACHE_BYTES = 16 << 20  # matrices up to this size are counted at GEMV_CACHED (measured: 0.33-0.37 ns up to 25 MB)
GD_STEP = 15_000.0  # the Python of one full-batch GD step besides its products (the update, the projection)
ROW = 20.0          # one row's residual or curvature weight (a loss's phi' or phi'': exp/tanh, a few passes)


# A derived retained-record cap leaves room for a forget request of this many records (families whose forget work
# is per record); larger requests are refused above the model's max_forget_batch.
FORGET_BATCH = 10


def grad_flops(p: int) -> float:
    """Multiply-adds of one per-example gradient of a linear-score loss with p parameters (scores, residual,
    outer product: about 4 passes over p)."""
    return 4.0 * p


def ogd_steps(n: float, p: int) -> float:
    """n projected OGD steps, one Python iteration each (gradient, step, projection)."""
    return n * (STEP + 8.0 * p * FLOP)


def draw(route: str) -> float:
    """One discrete Gaussian coordinate by the sampler route ``route`` (app/unlearning/mechanism/fast_dgauss.route)."""
    return {"kernel": RELEASE, "kernel_fallback": FALLBACK_DRAW}.get(route, PURE_DRAW)


def release(p: int) -> float:
    """One discrete Gaussian release of p coordinates (grid rounding, sampler, projection)."""
    return STEP + p * (RELEASE + 4.0 * FLOP)


def chunk_records(p: int) -> int:
    """Records in one full chunk of the retained store, a record being p + 1 floats (x, y)."""
    return max(1, min(CHUNK_RECORDS, CHUNK_BYTES // (F64 * (int(p) + 1))))


def small_chunk_records(p: int) -> int:
    """Records in the smallest chunk a learn leaves behind in a group (app/db/retained.py: a learn's rows for a
    group are merged into its last chunk below half of SMALL_BYTES, 32 KiB of rows): the chunk size to count for
    a group that learns a few records per request (sisa's shards)."""
    return max(1, min(chunk_records(p), (32 << 10) // (F64 * (int(p) + 1))))


def read(n: float, p: int, chunk: int | None = None) -> float:
    """Reading n retained records of p floats (and their label) from the store in bulk (every chunk that holds
    them, in step order), in chunks of at most ``chunk`` records (default: full chunks).  At least one chunk."""
    per = chunk_records(p) if chunk is None else max(1, min(int(chunk), chunk_records(p)))
    records = max(float(n), float(per))
    return STORE + records * F64 * (p + 2) * READ_BYTE + math.ceil(records / per) * CHUNK_OPEN


def read_random(k: float, p: int) -> float:
    """Reading k records scattered among those kept: a chunk opened for each."""
    return STORE + k * (CHUNK_OPEN + chunk_records(p) * F64 * (p + 2) * READ_BYTE)


def fast_ogd(n: float, p: int) -> float:
    """n projected OGD steps in the compiled loop of mechanism/fast.py (passive families, scalar losses): measured
    ~2 p ns and a fraction of a microsecond per step."""
    return CALL + n * (FAST_STEP + 4.0 * p * FLOP)


def exact_ogd(n: float, p: int) -> float:
    """n steps of the compiled exact OGD loop over rows of p parameters (learning and replay of retrain, sisa)."""
    return n * (EXACT_STEP + 4.0 * p * FLOP)


def gemv(n: float, p: int) -> float:
    """One matrix-vector product over n in-memory rows of p floats (cached while the matrix is small)."""
    rate = GEMV_CACHED if n * p * F64 <= GEMV_CACHE_BYTES else GEMV
    return n * p * rate


def gd_pass(n: float, p: int, chunk: int) -> float:
    """One full-batch gradient over n in-memory records in chunks of ``chunk`` (losses.grad_sum per chunk: the
    scores X theta, the residual, X^T r -- two matrix-vector products -- one numpy call each) and the GD step's
    update and projection.  Measured 0.27-0.41 ns per multiply-add of the two products at d = 75..1000 while
    cached (issue 36 item 3)."""
    rows = min(max(n, 1), max(chunk, 1))  # the products run chunk by chunk: the cache holds one chunk
    return (2.0 * math.ceil(max(n, 1) / rows) * gemv(rows, p) + n * ROW
            + math.ceil(max(n, 1) / max(chunk, 1)) * CALL + GD_STEP)


def hvp_pass(n: float, p: int, block: int) -> float:
    """One Hessian-vector product over n in-memory records (curvature weights known): X v, the weights, X^T (w s),
    in blocks of ``block`` rows."""
    rows = min(max(n, 1), max(block, 1))
    return 2.0 * math.ceil(max(n, 1) / rows) * gemv(rows, p) + n * ROW + math.ceil(max(n, 1) / rows) * CALL


def predict(n: float, p: int, outputs: int, members: int = 1) -> float:
    """Predicting n rows from published parameters: per member a call and the scores (n x outputs, p multiply-adds
    each: a matrix-vector product, ~0.5 ns each measured) and their output map (sigmoid, softmax: a few passes)."""
    return PREDICT_CALL + members * (CALL + n * outputs * (p * FLOP + PREDICT_OUTPUT))


def eigh(p: int) -> float:
    """A symmetric p x p eigendecomposition with eigenvectors (LAPACK syevd through numpy.linalg.eigh) and the solve
    through its factors: measured 0.11 ms at p = 26, 0.56 ms at 76, 9.2 ms at 301, 31 ms at 501 (one thread; issue
    36 item 3): per-column and p^2 overheads dominate below p ~ 300, the BLAS-3 reduction above."""
    return 8000.0 * p + 120.0 * p * p + 0.3 * p**3


def restart(p: int, draw: bool = True) -> float:
    """A restart of an online model: its state re-drawn from the noise source (``draw``) or zeroed (p coordinates),
    its clock and ledger reset."""
    # measured 0.20-0.29 ms (draw), 26-70 us (zeroed) at p = 1 251-5 001, mostly fixed (issue 36 item 3)
    return 8.0 * STEP + 40.0 * p if draw else 2.0 * STEP + 8.0 * p


@dataclass(frozen=True)
class Cost:
    """The worst case of one request of a model (work units; bytes).

    ``learn``: one learn of the batch; ``forget``: one forget of one record; ``forget_each``: each further record
    in the same forget request; ``retrain``: one exact retrain; ``array_bytes``: the largest single array;
    ``solve``: the side of the largest dense matrix factorised (0: none); ``forget_most``: the most any forget
    request can take, whatever its size (sisa: every shard replayed once).  The ``*_fields`` name the spec fields
    that drive each figure (API paths, most influential first)."""

    learn: float
    forget: float
    forget_each: float = 0.0
    retrain: float = 0.0
    array_bytes: float = 0.0
    solve: int = 0
    learn_fields: tuple[str, ...] = ("dim",)
    forget_fields: tuple[str, ...] = ("dim",)
    memory_fields: tuple[str, ...] = ("dim",)
    hint: str = ""  # appended to a refusal: what else would bring the figure down
    forget_most: float = math.inf

    def forget_request(self, k: int) -> float:
        """One forget request of k records."""
        return min(self.forget + max(0, k - 1) * self.forget_each, self.forget_most)


@dataclass(frozen=True)
class Budget:
    """What one request may take (app.config.Settings): ``work`` units, ``memory`` bytes of one array, ``batch``
    the largest request (Settings.max_batch), ``max_records`` the largest retained-record cap ever derived."""

    work: float
    memory: float
    batch: int
    max_records: int = 1_000_000


def largest(ok, lo: int, hi: int) -> int | None:
    """The largest integer in [lo, hi] for which the monotone predicate ``ok`` holds (None if none): the budget
    searches of admission (app/admission.py) and of feature maps (app/services/feature_maps.py)."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo
