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
READ = 25_000.0     # one retained record read from the store (AES-GCM open of its key and of its sealed row)
PAGE = 200_000.0    # one page query of the retained store (a chunk of ``chunk_size`` records)
PREDICT_OUTPUT = 20.0  # one output of a prediction (exp, normalisation, the argmax or threshold)
F64 = 8             # bytes per float64
DISTRIBUTED = 1.7   # descent_to_delete distributed: measured / counted (reservoir updates, slot bookkeeping, selection)


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


def read(n: float, p: int, chunk: int = 4096) -> float:
    """Reading n retained records of p floats from the store in pages of ``chunk`` records."""
    return n * (READ + 2.0 * p * FLOP) + math.ceil(max(n, 1) / max(chunk, 1)) * PAGE


def gd_pass(n: float, p: int, chunk: int) -> float:
    """One full-batch gradient over n in-memory records in chunks of ``chunk`` (one numpy call per chunk)."""
    return n * grad_flops(p) * FLOP + math.ceil(max(n, 1) / max(chunk, 1)) * CALL + STEP


def predict(n: float, p: int, outputs: int, members: int = 1) -> float:
    """Predicting n rows from published parameters: the scores (n x outputs, p multiply-adds each, per member) and
    their output map (sigmoid, softmax: a few passes over the scores)."""
    return CALL + members * n * (2.0 * p * FLOP + PREDICT_OUTPUT * outputs)


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
