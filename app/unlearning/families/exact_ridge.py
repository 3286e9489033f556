"""exact_ridge: ridge regression and least-squares classification over integer sufficient statistics, forgotten
exactly without keeping the data (the "summation form" of Cao & Yang, "Towards Making Systems Forget with Machine
Unlearning", IEEE S&P 2015).

* **Model.**  With x~ = (x, 1), the published weights minimise  sum_i ||W x~_i - t_i||^2 + l2 ||W||_F^2  over the
  records held (a sum, not a mean: the regulariser's weight does not change with the number of records, and the
  intercept is regularised like the weights, so the system is positive definite from the first record on and
  the model with no record is W = 0).  Regression (loss ``squared``): one output, t = y.  Classification (loss
  ``squared`` with ``n_classes`` or ``classes``, K >= 2): K outputs, one-vs-rest, t_k = +1 for the record's class
  and -1 for the others; W is K x (d + 1), published row-major like softmax's.
* **State: two integer sums on a public grid.**  A = sum q(x~) q(x~)^T and B = sum q(t) q(x~)^T, int64, where
  q(x~) = (rint(x 2^kx), 2^kc) (the intercept's 1 on a grid of its own, exactly) and q(t) = rint(y 2^ky)
  (regression) or t itself (classification, ky = 0).  kx = bits - e(X), kc = bits - 1 and ky = bits - e(Y), with
  bits = ``grid_bits`` (default 20), X = x_norm (1 + tol) and Y = y_abs (1 + tol) the declared bounds and e(v)
  the exponent with v <= 2^e(v) (math.frexp): every quantised coordinate is an integer of magnitude at most
  2^bits (+ 1/2 of rounding), whatever the scale of the bounds.  The grid depends on the spec alone, and the
  same rule quantises a record at learn and
  at forget, so a forget subtracts exactly what the learn added: integer addition is exact and commutative, and
  the state after any schedule of learns and forgets is bit for bit the state of a model that learned only the
  records still held, in any order.  No example is kept (unless ``deletion_features`` is ``retained``).
* **No overflow, by construction.**  One record adds at most P = max(Bx^2, Bx By) in magnitude to any entry
  (Bx = sqrt((2^bits + sqrt(d)/2)^2 + 4^(bits-1)) bounds ||q(x~)||, By = 2^bits + 1/2 or 1 bounds |q(t)|).
  The model holds at most
  ``record_cap`` = floor((2^63 - 1) / P) records (a public constant; a learn beyond it is refused, 409
  horizon-reached, before anything changes), so no int64 entry can wrap.  The products are formed with float64
  BLAS in chunks of floor(2^53 / P) rows: every partial sum of integers below 2^53 is exact in float64, whatever
  order the BLAS adds in, so each chunk's product is the exact integer matrix, then added in int64 (within a
  chunk, summed in float64 over sub-blocks small enough for OpenBLAS to stay on one thread).  (float64
  BLAS is why: exact int64 products in numpy bypass BLAS and run ~10x slower; Python integers ~1000x.)  At the
  default 20 bits and d = 64 the cap is about 5.6 million records held.
* **Published parameters** are a deterministic function of the state alone: with D = diag(2^-kx, ..., 2^-kc) the
  grid's scales (powers of two: exact), W solves (D A D + l2 I) W^T = D B^T 2^-ky by LU (LAPACK gesv); where that
  fails in floating point (l2 below A's round-off) by the eigendecomposition with eigenvalues clipped at l2, so
  ||W|| <= ||D B^T 2^-ky|| / l2 whatever the conditioning.  The engine caches them
  until its state changes; the service stores them once per version.
* **Forget.**  ``deletion_features = "client"`` (default): the client resends the forgotten records' features and
  labels with the unlearn request and the service checks them against the keyed check code (HMAC) kept at learn;
  a resent record that differs is refused (422 example-mismatch) and nothing changes.  ``"retained"``: the
  service keeps each example sealed, as the data-keeping families do, forgets by id and can retrain.  Either way
  the certificate is mechanism "exact", sigma = rho = 0: nothing is spent.
* **Scores.**  A least-squares classifier's K outputs are estimates of E[t_k | x] = 2 P(class k | x) - 1 within
  the linear span; ``predict`` answers the class of the largest output, and as "probabilities" the outputs mapped
  to (s + 1) / 2, clipped to [0, 1] and normalised to sum 1 (uniform when all are clipped to 0).  They rank the
  classes like the outputs do but are NOT calibrated probabilities.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.errors import ForgetError, InputError, SpecError
from ..contract.spec import BOUND_TOLERANCE, ModelSpec
from ..contract.unlearner import RetainedData, Unlearner, checked_forget_steps
from ..maths import work_budget as wb
from ..mechanism.calibration import Checks
from ..mechanism.noise import NoiseSource

DELETION_FEATURES = ("client", "retained")
DEFAULT_GRID_BITS = 20
GRID_BITS = (4, 24)
INT64_MAX = 2**63 - 1
FLOAT_EXACT = 2**53
CHUNK_SIZE = 4096  # retained records read per page (retained mode)
# OpenBLAS multiplies single-threaded when m n k <= 2^18 and with its thread pool above; on a shared or loaded
# machine the pool's threads wait on each other and one request's product (1 000 x 65 at d = 64) took 50-100x
# longer (0.05 s instead of 0.5 ms, 2 cores, load 12).  Products of at most 2^18 / p^2 rows stay below it (at
# least 32 rows: at a large p the product is big enough for the threads to pay, and calls have a cost too).
BLAS_SINGLE_THREAD = 2**18
MIN_BLOCK_ROWS = 32


def block_rows(p: int, outputs: int) -> tuple[int, int]:
    """Rows per product for A (p x p) and for B (outputs x p): below OpenBLAS's threading threshold where that
    leaves at least ``MIN_BLOCK_ROWS`` rows."""
    return (max(MIN_BLOCK_ROWS, BLAS_SINGLE_THREAD // (p * p)), max(MIN_BLOCK_ROWS, BLAS_SINGLE_THREAD // (p * outputs)))
_HP = {"deletion_features", "grid_bits"}


class RidgeGrid:
    """The public fixed-point grid of a spec and the bounds that follow from it (all from the spec alone)."""

    def __init__(self, spec: ModelSpec, bits: int):
        self.bits = bits
        self.classes = int(spec.n_classes)
        x = spec.x_norm * (1.0 + BOUND_TOLERANCE)
        self.kx = bits - math.frexp(x)[1] if math.isfinite(x) else -(2**20)
        self.kc = bits - 1  # the intercept coordinate 1 is exactly 2^(bits - 1) on its own grid
        self.x_scale = math.ldexp(1.0, self.kx) if math.isfinite(x) else 0.0
        x_tilde = math.sqrt(x * x + 1.0)  # inf for a huge x_norm
        if self.classes:
            self.ky, by = 0, 1.0
        else:
            y = spec.y_abs * (1.0 + BOUND_TOLERANCE)
            self.ky = bits - math.frexp(y)[1] if math.isfinite(y) else -(2**20)
            by = 2.0**bits + 0.5
        bx = math.sqrt((2.0**bits + 0.5 * math.sqrt(spec.dim)) ** 2 + 4.0 ** (bits - 1))  # bounds ||q(x~)||
        per = max(bx * bx, bx * by)  # the most one record adds to |A_ij| or |B_kj|
        self.record_cap = int(INT64_MAX // math.ceil(per))
        self.chunk = max(1, int(FLOAT_EXACT // math.ceil(per)))
        self.x_tilde = x_tilde
        self.outputs = self.classes or 1

    def features(self, X: np.ndarray) -> np.ndarray:
        """q(x~): the records' augmented features on the grid (integer-valued float64, n x (d + 1))."""
        Xq = np.empty((X.shape[0], X.shape[1] + 1))
        Xq[:, :-1] = X
        Xq[:, -1] = 0.0
        # times 2^kx, a normal float for every finite x_norm (kx >= bits - 1024): as exact as ldexp (both round
        # only a subnormal product, identically), and ~10x faster; on the whole contiguous array (faster than
        # the strided feature columns), the intercept column set after
        np.multiply(Xq, self.x_scale, out=Xq)
        np.rint(Xq, out=Xq)
        Xq[:, -1] = math.ldexp(1.0, self.kc)
        return Xq

    def exponents(self, dim: int) -> np.ndarray:
        """Per coordinate of x~, the grid exponent k (q = rint(v 2^k)): kx for the features, kc for the intercept."""
        out = np.full(dim + 1, self.kx, dtype=np.int64)
        out[-1] = self.kc
        return out

    def targets(self, y: np.ndarray) -> np.ndarray:
        """q(t): n x outputs integer-valued float64 (classification: +1 for the class, -1 for the others)."""
        if self.classes:
            T = -np.ones((len(y), self.classes))
            T[np.arange(len(y)), np.asarray(y, dtype=np.int64)] = 1.0
            return T
        return np.rint(np.ldexp(np.asarray(y, dtype=np.float64), self.ky))[:, None]  # ky may pass 1023: ldexp


class ExactRidge(Unlearner):
    algorithm = "exact_ridge"
    accounting = "per_update"
    # the default mode keeps no data; an instance with deletion_features = "retained" shadows these (the service
    # reads the instance, as for memory_pair)
    needs_retained_data: ClassVar[bool] = False
    needs_deletion_features: ClassVar[bool] = True
    supports_retrain: ClassVar[bool] = False
    classifier_losses: ClassVar[tuple[str, ...]] = ("squared",)
    guarantee_definition = "exact unlearning (rho = 0)"
    guarantee_words = (
        "The model's state is two integer sums over the records it holds (of x x^T and of y x, on a public "
        "fixed-point grid), and the deletion subtracts the record's terms exactly: the state after it is bit for "
        "bit the state of a model that never learned the record, and what the model publishes is computed from "
        "that state alone."
    )

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.declare_loss(hp)
        self.grid = RidgeGrid(spec, int(hp["grid_bits"]))
        self.needs_retained_data = hp["deletion_features"] == "retained"
        self.needs_deletion_features = hp["deletion_features"] == "client"
        self.supports_retrain = self.needs_retained_data
        self._A: np.ndarray | None = None  # allocated on first use: the registry builds an engine to check its
        self._B: np.ndarray | None = None  # ledger before the work budget has refused a p x p state too large
        self.t = 0
        self.n_deletions = 0
        self.epoch = 0
        self._published: np.ndarray | None = None
        self._exponents: tuple[np.ndarray, np.ndarray] | None = None

    # ---- spec -----------------------------------------------------------------------------------------------------
    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        if spec.loss != "squared":
            raise SpecError(f"{cls.algorithm} serves loss squared only (regression, or least-squares "
                            "classification with n_classes or classes)", fields=("loss",))
        hp = dict(spec.hyperparameters)
        unknown = set(hp) - _HP
        if unknown:
            raise SpecError(f"unknown hyperparameters for {cls.algorithm}: {', '.join(sorted(unknown))}")
        hp.setdefault("deletion_features", "client")
        if hp["deletion_features"] not in DELETION_FEATURES:
            raise SpecError(f"deletion_features must be one of {', '.join(DELETION_FEATURES)}",
                            fields=("hyperparameters.deletion_features",))
        bits = hp.setdefault("grid_bits", DEFAULT_GRID_BITS)
        if isinstance(bits, float) and bits.is_integer():
            bits = int(bits)
        lo, hi = GRID_BITS
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not lo <= bits <= hi:
            raise SpecError(f"grid_bits must be an integer in [{GRID_BITS[0]}, {GRID_BITS[1]}]",
                            fields=("hyperparameters.grid_bits",))
        hp["grid_bits"] = int(bits)
        if not spec.l2 > 0:
            raise SpecError(f"{cls.algorithm} needs l2 > 0 (the ridge penalty makes the system positive definite)",
                            fields=("l2",))
        return hp

    @classmethod
    def check_calibration(cls, spec: ModelSpec) -> None:
        """Every number the solve forms must be finite at its worst case: the scaled sums (record_cap records of
        norm X~ and label Y), the penalty, and the bound ||W|| <= ||B|| / l2 on the published weights and the
        scores they give (X~ ||W||)."""
        checks = Checks(cls.algorithm)
        hp = cls.normalize_hyperparameters(spec)
        grid = RidgeGrid(spec, int(hp["grid_bits"]))
        n = float(grid.record_cap)
        x = checks.squared("x~ bound", grid.x_tilde, "bounds.x_norm")
        checks.finite("sum of x~ x~^T", n * x * x, "bounds.x_norm")
        y = 1.0 if grid.classes else spec.y_abs * (1.0 + BOUND_TOLERANCE)
        b = checks.finite("sum of y x~", n * x * y * math.sqrt(grid.outputs), "bounds.y_abs", "bounds.x_norm")
        w = checks.finite("weight norm bound", b / spec.l2, "l2", "bounds.y_abs", "bounds.x_norm")
        checks.finite("score bound", w * x, "l2", "bounds.x_norm", "bounds.y_abs")
        checks.finite("grid scale", lambda: math.ldexp(1.0, -2 * grid.kx), "bounds.x_norm")
        checks.finite("grid scale of the intercept terms", lambda: math.ldexp(1.0, -(grid.kx + grid.kc)),
                      "bounds.x_norm")
        checks.finite("label grid scale", lambda: math.ldexp(1.0, -(grid.kx + grid.ky)), "bounds.y_abs",
                      "bounds.x_norm")

    @classmethod
    def keeps_records(cls, spec: ModelSpec) -> bool:
        return spec.hyperparameters.get("deletion_features", "client") == "retained"

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """Learn: quantise the batch and add its products (BLAS-3 products of p x n by n x (p + K), in blocks of
        rows: ``block_rows``), then one
        p x p solve for the published weights (counted as the eigendecomposition, about 10 p^3 flops, which
        serves where LU fails).  Forget: the same
        for the records forgotten (and, keeping data, reading them).  Retrain (retained mode): read every record
        held and rebuild the sums.  Memory: the p x p sums, the solve's dense matrix (``solve``), a chunk."""
        hp = spec.hyperparameters
        p, k = spec.dim + 1, max(1, spec.n_classes)
        solve = 10.0 * p**3 * wb.DENSE_FLOP + 4.0 * p * p * wb.FLOP + wb.STEP

        rows_a, rows_b = block_rows(p, k)

        def add(n: float) -> float:  # one call per block of rows (block_rows), A's and B's
            calls = math.ceil(max(n, 1) / rows_a) + math.ceil(max(n, 1) / rows_b)
            return n * (2.0 * p * wb.FLOP + p * (p + k) * wb.DENSE_FLOP) + calls * wb.CALL

        keeps = cls.keeps_records(spec)
        N = int(hp.get("max_records") or batch) if keeps else 0
        read1 = wb.read(1, p, CHUNK_SIZE) if keeps else 0.0
        each = add(1) + (wb.READ + 2.0 * p * wb.FLOP if keeps else 0.0)
        forget_fields = ("dim", "n_classes") if spec.n_classes else ("dim",)
        return wb.Cost(learn=add(batch) + solve, forget=add(1) + read1 + solve, forget_each=each,
                       retrain=(wb.read(N, p, CHUNK_SIZE) + add(N) + solve) if keeps else 0.0,
                       array_bytes=wb.F64 * max(p * p, p * k, min(max(batch, N), 4096) * (p + k)),
                       solve=p, learn_fields=("dim",),
                       forget_fields=(("hyperparameters.max_records",) if keeps else ()) + forget_fields,
                       memory_fields=forget_fields)

    # ---- state ----------------------------------------------------------------------------------------------------
    @property
    def A(self) -> np.ndarray:
        if self._A is None:
            self._A = np.zeros((self.spec.dim + 1,) * 2, dtype=np.int64)
        return self._A

    @A.setter
    def A(self, value: np.ndarray) -> None:
        self._A = value

    @property
    def B(self) -> np.ndarray:
        if self._B is None:
            self._B = np.zeros((self.grid.outputs, self.spec.dim + 1), dtype=np.int64)
        return self._B

    @B.setter
    def B(self, value: np.ndarray) -> None:
        self._B = value

    def state(self) -> dict[str, Any]:
        return {"A": self.A.copy(), "B": self.B.copy(), "t": self.t, "n_deletions": self.n_deletions,
                "epoch": self.epoch}

    def load_state(self, state: Mapping[str, Any]) -> None:
        A = np.asarray(state["A"])
        B = np.asarray(state["B"])
        p = self.spec.dim + 1
        if A.shape != (p, p) or B.shape != (self.grid.outputs, p) or A.dtype != np.int64 or B.dtype != np.int64:
            raise ValueError("stored sums do not match the model's dimension, classes or type")
        self.A, self.B = A.copy(), B.copy()
        self.t = int(state["t"])
        self.n_deletions = int(state["n_deletions"])
        self.epoch = int(state["epoch"])
        self._published = None

    @property
    def step(self) -> int:
        return self.t

    def records_held(self) -> int:
        return self.t - self.n_deletions

    def learn_capacity(self) -> int | None:
        """The overflow bound (``record_cap`` records held), and in retained mode the retained-record cap too."""
        left = self.grid.record_cap - self.records_held()
        cap = super().learn_capacity()
        return max(0, left if cap is None else min(cap, left))

    def constants(self) -> dict[str, float]:
        return {"mu": self.spec.l2, "x_grid_exponent": float(-self.grid.kx),
                "y_grid_exponent": float(-self.grid.ky), "record_cap": float(self.grid.record_cap)}

    def ledger(self) -> dict[str, Any]:
        return {"accounting": self.accounting, "rho_spent": 0.0, "rho_budget": None,
                "capacity_total": None, "capacity_left": None, "deletions": self.n_deletions}

    # ---- the sums ---------------------------------------------------------------------------------------------------
    def _sums(self, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exact integer sums of records (X, y): float64 BLAS on chunks whose partial sums stay below 2^53."""
        X = np.asarray(X, dtype=np.float64).reshape(len(y), self.spec.dim)
        p, k = self.spec.dim + 1, self.grid.outputs
        A = np.zeros((p, p), dtype=np.int64)
        B = np.zeros((k, p), dtype=np.int64)
        rows_a, rows_b = (max(1, min(self.grid.chunk, r)) for r in block_rows(p, k))
        for a in range(0, len(y), self.grid.chunk):
            Xq = self.grid.features(X[a : a + self.grid.chunk])
            Tq = self.grid.targets(y[a : a + self.grid.chunk])
            FA, FB = Xq[:rows_a].T @ Xq[:rows_a], Tq[:rows_b].T @ Xq[:rows_b]
            for b in range(rows_a, len(Xq), rows_a):  # float64 sums of integers below 2^53 (one chunk): exact
                FA += Xq[b : b + rows_a].T @ Xq[b : b + rows_a]
            for b in range(rows_b, len(Xq), rows_b):
                FB += Tq[b : b + rows_b].T @ Xq[b : b + rows_b]
            A += FA.astype(np.int64)
            B += FB.astype(np.int64)
        return A, B

    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if len(y) > self.grid.record_cap - self.records_held():  # the service refuses first (learn_capacity)
            raise InputError(f"{self.algorithm} holds at most {self.grid.record_cap} records (its int64 sums "
                             "could overflow beyond)", code="horizon-reached")
        A, B = self._sums(X, y)
        steps = np.arange(self.t + 1, self.t + 1 + len(y), dtype=np.int64)
        self.A += A
        self.B += B
        self.t += len(y)
        self._published = None
        return steps

    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = checked_forget_steps(steps, self.t)
        if len(steps) > self.records_held():
            raise ForgetError("more records named than the model holds")
        if not steps:
            return []
        if retained is None:
            raise ForgetError(f"{self.algorithm} needs the forgotten records' features and labels to forget")
        try:
            X, y = retained.get(steps)
        except KeyError:
            raise ForgetError("some steps are not held (already forgotten?)") from None
        A, B = self._sums(X, np.asarray(y, dtype=np.float64).reshape(-1))
        self.A -= A
        self.B -= B
        self._published = None
        certs = []
        for u in steps:
            self.n_deletions += 1
            certs.append(Certificate(learned_step=u, forgotten_step=self.t, deletion_index=self.n_deletions,
                                     mechanism="exact", sigma=0.0, sensitivity=0.0, rho=0.0))
        return certs

    def retrain(self, retained: RetainedData) -> None:
        """Retained mode: the sums rebuilt from the examples held (equal to the kept sums: a new ledger epoch)."""
        p, k = self.spec.dim + 1, self.grid.outputs
        A, B = np.zeros((p, p), dtype=np.int64), np.zeros((k, p), dtype=np.int64)
        for _, X, y in retained.chunks(CHUNK_SIZE):
            a, b = self._sums(X, np.asarray(y, dtype=np.float64).reshape(-1))
            A += a
            B += b
        self.A, self.B = A, B
        self._published = None
        self.epoch += 1

    # ---- the published weights ---------------------------------------------------------------------------------------
    def weights(self) -> np.ndarray:
        """W (outputs x (d + 1)) from the sums alone: (D A D + l2 I) W^T = D B^T 2^-ky, with D = diag(2^-k) the
        grid's scales (2^-kx for the features, 2^-kc for the intercept): an LU solve, or where it fails (singular
        in floating point, a non-finite answer) the eigendecomposition.  Deterministic in the sums."""
        if self._exponents is None:  # the grid's, from the spec alone
            k = self.grid.exponents(self.spec.dim)
            self._exponents = (-(k[:, None] + k[None, :]), -(k[None, :] + self.grid.ky))
        M = np.ldexp(self.A.astype(np.float64), self._exponents[0])
        R = np.ldexp(self.B.astype(np.float64), self._exponents[1])
        M.flat[:: M.shape[0] + 1] += self.spec.l2
        try:  # LU (LAPACK gesv), ~10x faster than the eigendecomposition at d = 64
            W = np.linalg.solve(M, R.T)
            if np.all(np.isfinite(W)):
                return np.ascontiguousarray(W.T)
        except np.linalg.LinAlgError:
            pass
        # singular in floating point (l2 below the round-off of A): the eigendecomposition, eigenvalues clipped
        # at l2, whose answer obeys ||W|| <= ||R|| / l2 whatever the conditioning
        e, V = np.linalg.eigh(M)
        W = ((V @ ((V.T @ R.T) / np.maximum(e, self.spec.l2)[:, None])).T)
        return np.ascontiguousarray(W)

    def published(self) -> np.ndarray:
        if self._published is None:
            W = self.weights()
            self._published = W.reshape(-1) if self.spec.n_classes else W[0].copy()
        return self._published.copy()

    # ---- prediction -------------------------------------------------------------------------------------------------
    @classmethod
    def predict_published(cls, spec: ModelSpec, loss: Any, published: np.ndarray,
                          X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Regression: the value.  Classification: the class of the largest output, and per class
        clip((s + 1) / 2, 0, 1) normalised to sum 1 (not calibrated probabilities; module docstring)."""
        if not spec.n_classes:
            return super().predict_published(spec, loss, published, X)
        W = published.reshape(spec.n_classes, spec.dim + 1)
        with np.errstate(over="ignore", invalid="ignore"):
            S = X @ W[:, :-1].T + W[:, -1]
        if not np.all(np.isfinite(S)):
            raise InputError("Feature values too large to score.", code="out-of-bounds-input")
        P = np.clip((S + 1.0) * 0.5, 0.0, 1.0)
        total = P.sum(axis=1, keepdims=True)
        P = np.where(total > 0.0, P / np.where(total > 0.0, total, 1.0), 1.0 / spec.n_classes)
        return np.argmax(S, axis=1).astype(np.float64), P
