"""exact_ridge: ridge regression and least-squares classification over integer sufficient statistics, forgotten
exactly without keeping the data (the "summation form" of Cao & Yang, "Towards Making Systems Forget with Machine
Unlearning", IEEE S&P 2015).

* **Model.**  With x~ = (x, 1), the published weights minimise  sum_i ||W x~_i - t_i||^2 + l2 ||W||_F^2  over the
  records held (a sum, not a mean: the regulariser's weight does not change with the number of records, and the
  intercept is regularised like the weights, so the system is positive definite from the first record on and
  the model with no record is W = 0).  Regression (loss ``squared``): one output, t = y.  Classification (loss
  ``squared`` with ``n_classes`` or ``classes``, K >= 2): K outputs, one-vs-rest, t_k = +1 for the record's class
  and -1 for the others; W is K x (d + 1), published row-major like softmax's.  The K outputs share one matrix and
  are solved together, one factorisation for all classes (multi-output least squares, which is one-vs-rest under
  squared loss: issue 39 item 4).
* **State: integer sums on a public grid** (ridge_sums.py): A = sum q(x~) q(x~)^T and B = sum q(t) q(x~)^T, where
  q rounds to a fixed-point grid of ``grid_bits`` (default 20) bits that depends on the spec alone, and the same
  rule quantises a record at learn and at forget, so a forget subtracts exactly what the learn added: integer
  addition is exact and commutative, and the state after any schedule of learns and forgets is bit for bit the
  state of a model that learned only the records still held, in any order.  No example is kept (unless
  ``deletion_features`` is ``retained``).
* **No overflow, by construction** (issue 36 item 5).  Every entry is two int64 words (value = hi 2^62 + lo,
  canonical, hi absent while zero: ridge_sums.py), so the sums hold up to ~2^115; the model holds at most
  ``record_cap`` = 2^53 - 1 records (a public constant, an integer in the API; less only where the declared bounds
  bring the sums or weights near the float range's edge, never less than the one-word cap of before; a learn
  beyond it is refused, 409 horizon-reached, before anything changes).  Below 2^61 per entry (about 1.6 million records at 20 bits, d = 64)
  the second word does not exist and nothing changes from one int64 word per entry; states stored with one word
  load as the same values.  The products are formed with float64 BLAS in chunks of floor(2^53 / P) rows: every
  partial sum of integers below 2^53 is exact in float64, whatever order the BLAS adds in.
* **Published parameters** are a deterministic function of the state alone (ridge_solve.py): with D = diag(2^-kx,
  ..., 2^-kc) the grid's scales (powers of two: exact), W solves (D A D + l2 I) W^T = D B^T 2^-ky by Cholesky, or
  where that fails in floating point by the eigendecomposition with eigenvalues clipped at l2; BLAS pinned to one
  thread, so the weights (and the receipts' parameter hash) do not depend on the machine's core count.
  ``l2_selection: "gcv"`` chooses the penalty by generalised cross-validation from the integer sums alone (and a
  third sum C = sum q(t)^2): still a function of the state, so bit-identical after forgets; it minimises squared
  error, not accuracy.  The engine caches the weights until its state changes.
* **Publication** (issue 38).  ``"exact"`` (default) publishes the weights of the exact sums: two versions around a
  forget differ by exactly the record's influence, and an observer who knows or estimates H reads the record off
  them (docs/receipts.md, "What an observer of versions learns").  ``"private"`` keeps the sums exact inside and
  publishes weights solved from noisy sums (binary-tree continual release, ridge_private.py): every published
  version is (epsilon, delta)-DP for each record's learn and forget, charged at creation, and no exact record count
  leaves the model.
* **Forget.**  ``deletion_features = "client"`` (default): the client resends the forgotten records' features and
  labels with the unlearn request and the service checks them against the keyed check code (HMAC) kept at learn;
  a resent record that differs is refused (422 example-mismatch) and nothing changes.  ``"retained"``: the
  service keeps each example sealed, as the data-keeping families do, forgets by id and can retrain.  Either way
  the secret state forgets exactly and nothing is spent (exact publication: mechanism "exact", rho = 0; private:
  "dp_from_start", rho = 0, the publication's rho having been charged at creation).
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
from ..mechanism.fast_dgauss import route as dgauss_route
from ..mechanism.noise import NoiseSource
from . import ridge_private as private
from .narrow_words import narrow_all, wide_all
from .ridge_solve import GCV_STEPS, gcv_solve, solve_spd
from .ridge_sums import (BLAS_SINGLE_THREAD, DEFAULT_GRID_BITS, GRID_BITS, LO_LIMIT, MIN_BLOCK_ROWS,  # noqa: F401
                         RidgeGrid, Scale, WideInt, accumulate, block_rows, from_upper, upper_state)

DELETION_FEATURES = ("client", "retained")
L2_SELECTION = ("fixed", "gcv")
CHUNK_SIZE = 4096  # retained records read per page (retained mode)
_HP = {"deletion_features", "grid_bits", "publication", "release_horizon", "release_every", "l2_selection"}
EXACT_WORDS = (
    "The model's state is two integer sums over the records it holds (of x x^T and of y x, on a public "
    "fixed-point grid), and the deletion subtracts the record's terms exactly: the state after it is bit for "
    "bit the state of a model that never learned the record, and what the model publishes is computed from "
    "that state alone."
)


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
    guarantee_words = EXACT_WORDS

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.declare_loss(hp)
        self.grid = RidgeGrid(spec, int(hp["grid_bits"]))
        self.needs_retained_data = hp["deletion_features"] == "retained"
        self.needs_deletion_features = hp["deletion_features"] == "client"
        # a private model's releases would not start again with a retrain (their cost is the model's): no retrain
        self.supports_retrain = self.needs_retained_data and hp["publication"] == "exact"
        self.gcv = hp["l2_selection"] == "gcv"
        self.private = (private.PrivatePublication(spec, self.grid, hp) if hp["publication"] == "private"
                        else None)
        # issue 36 item 1: a learn adds exact integer sums, so batches learned one after another equal their
        # concatenation bit for bit and the service may log a learn as its batch (app/state_store.py;
        # tests/test_state_log.py checks the claim); not a private model, whose learn may draw a release's noise
        self.learn_replays_exactly = self.private is None
        self.publish_beside_state = True  # published() reads the sums (or the last release) and caches W only
        if self.private is not None:  # the instance states its own guarantee and accounting (read by the service)
            self.accounting = "dp_from_start"
            self.guarantee_definition = private.DEFINITION
            self.guarantee_words = private.WORDS
        self._sums: list[WideInt] | None = None  # allocated on first use: the registry builds an engine to check
        self.t = 0                                 # its ledger before the work budget has refused a state too large
        self.n_deletions = 0
        self.epoch = 0
        self._published: np.ndarray | None = None
        self._exponents: tuple[Scale, Scale] | None = None

    # ---- spec -----------------------------------------------------------------------------------------------------
    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        """deletion_features (client | retained), publication (exact | private; private needs release_horizon and
        takes release_every), grid_bits (integer in [4, 24]; default 20, or 10 with publication private),
        l2_selection (fixed | gcv; gcv with publication exact only)."""
        if spec.loss != "squared":
            raise SpecError(f"{cls.algorithm} serves loss squared only (regression, or least-squares "
                            "classification with n_classes or classes)", fields=("loss",))
        hp = dict(spec.hyperparameters)
        unknown = set(hp) - _HP
        if unknown:
            raise SpecError(f"unknown hyperparameters for {cls.algorithm}: {', '.join(sorted(unknown))}")
        for name, allowed in (("deletion_features", DELETION_FEATURES), ("publication", private.PUBLICATIONS),
                              ("l2_selection", L2_SELECTION)):
            hp.setdefault(name, allowed[0])
            if hp[name] not in allowed:
                raise SpecError(f"{name} must be one of {', '.join(allowed)}", fields=(f"hyperparameters.{name}",))
        is_private = hp["publication"] == "private"
        if is_private:
            private.normalize_private(hp)
            if hp["l2_selection"] == "gcv":
                raise SpecError("l2_selection gcv needs the exact sums of squares, which a private model does not "
                                "publish: use l2_selection fixed with publication private",
                                fields=("hyperparameters.l2_selection",))
        else:
            extra = sorted({"release_horizon", "release_every"} & set(hp))
            if extra:
                raise SpecError(f"{extra[0]} applies to publication private only",
                                fields=(f"hyperparameters.{extra[0]}",))
        bits = hp.setdefault("grid_bits", private.PRIVATE_GRID_BITS if is_private else DEFAULT_GRID_BITS)
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
        scores they give (X~ ||W||); a private model's noise must fit its integer words (ridge_private.py)."""
        checks = Checks(cls.algorithm)
        hp = cls.normalize_hyperparameters(spec)
        grid = RidgeGrid(spec, int(hp["grid_bits"]))
        n = float(grid.record_cap)
        x = checks.squared("x~ bound", grid.x_tilde, "bounds.x_norm")
        checks.finite("sum of x~ x~^T", n * x * x, "bounds.x_norm")
        y = 1.0 if grid.classes else spec.y_abs * (1.0 + BOUND_TOLERANCE)
        b = checks.finite("sum of y x~", n * x * y * math.sqrt(grid.outputs), "bounds.y_abs", "bounds.x_norm")
        if hp["l2_selection"] == "gcv":
            checks.finite("sum of y^2", n * y * y * grid.outputs, "bounds.y_abs")
        w = checks.finite("weight norm bound", b / spec.l2, "l2", "bounds.y_abs", "bounds.x_norm")
        checks.finite("score bound", w * x, "l2", "bounds.x_norm", "bounds.y_abs")
        checks.finite("grid scale", lambda: math.ldexp(1.0, -2 * grid.kx), "bounds.x_norm")
        checks.finite("grid scale of the intercept terms", lambda: math.ldexp(1.0, -(grid.kx + grid.kc)),
                      "bounds.x_norm")
        checks.finite("label grid scale", lambda: math.ldexp(1.0, -(grid.kx + grid.ky)), "bounds.y_abs",
                      "bounds.x_norm")
        if hp["publication"] == "private":
            eps = ("privacy.epsilon", "privacy.delta", "hyperparameters.release_horizon")
            checks.finite("rho", spec.rho, *eps, positive=True)
            pub = private.PrivatePublication(spec, grid, hp)
            pub.check()
            # the noise the weights are solved from: its worst case in R (and the shift in M) stays finite, and so
            # does the weight bound ||W|| <= ||R^|| / l2 the clipped solve keeps
            tail = pub.levels * private.NOISE_TAILS
            r_noise = checks.finite("noise of the released y x~ sums", lambda: math.ldexp(
                tail * pub.sigma_b * math.sqrt(grid.outputs * (spec.dim + 1)), -(grid.kx + grid.ky)),
                *eps, "bounds.x_norm", "bounds.y_abs")
            checks.finite("noise of the released x~ x~^T sums", lambda: math.ldexp(
                tail * pub.sigma_a * (spec.dim + 1), -2 * min(grid.kx, grid.kc)), *eps, "bounds.x_norm")
            checks.finite("weight norm bound with the noise", (b + r_noise) / spec.l2, "l2", *eps)
            checks.finite("score bound with the noise", (b + r_noise) / spec.l2 * x, "l2", *eps)

    @classmethod
    def keeps_records(cls, spec: ModelSpec) -> bool:
        return spec.hyperparameters.get("deletion_features", "client") == "retained"

    @classmethod
    def publishes_counts(cls, spec: ModelSpec) -> bool:
        """A private model's record counts are withheld (ridge_private.py)."""
        return spec.hyperparameters.get("publication", "exact") != "private"

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """Learn: quantise the batch and add its products (BLAS-3 products of p x n by n x (p + K), in blocks of
        rows: ``block_rows``), then one
        p x p solve for the published weights (counted as the eigendecomposition, ``wb.eigh``, which serves where
        Cholesky fails, and always for GCV and private releases: ~7 times the Cholesky solve at p = 301, which the
        estimate does not count separately); a private release draws the node's
        p (p + 1) / 2 + K p discrete Gaussian coordinates.  Forget: the same
        for the records forgotten (and, keeping data, reading them).  Retrain (retained mode): read every record
        held and rebuild the sums.  Memory: the p x p sums (a second word beyond 2^61), the solve's dense matrix
        (``solve``), a chunk."""
        hp = spec.hyperparameters
        p, k = spec.dim + 1, max(1, spec.n_classes)
        solve = wb.eigh(p) + 4.0 * p * p * wb.FLOP + wb.STEP
        if hp.get("l2_selection") == "gcv":
            solve += (GCV_STEPS + 1) * p * (k + 2) * wb.FLOP
        if hp.get("publication") == "private":
            eng = private.PrivatePublication(spec, RidgeGrid(spec, int(hp["grid_bits"])), hp)
            draws = (p * (p + 1) / 2) * wb.draw(dgauss_route(eng.sigma_a)) + k * p * wb.draw(dgauss_route(eng.sigma_b))
            solve += draws + eng.levels * p * (p + k) * wb.FLOP
        rows_a, rows_b = block_rows(p, k)

        def add(n: float) -> float:  # one call per block of rows (block_rows), A's and B's
            calls = math.ceil(max(n, 1) / min(rows_a, CHUNK_SIZE)) + math.ceil(max(n, 1) / min(rows_b, CHUNK_SIZE))
            return n * (2.0 * p * wb.FLOP + p * (p + k) * wb.DENSE_FLOP) + calls * wb.CALL + 3.0 * p * (p + k) * wb.FLOP

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
    def sums(self) -> list[WideInt]:
        """[A, B] (and C = sum q(t)^2 per output with l2_selection gcv), each two-word (ridge_sums.py)."""
        if self._sums is None:
            p, k = self.spec.dim + 1, self.grid.outputs
            self._sums = [WideInt((p, p)), WideInt((k, p))] + ([WideInt((k,))] if self.gcv else [])
        return self._sums

    @property
    def A(self) -> np.ndarray:
        """A's low words: its values while the second word is absent (tests)."""
        return self.sums[0].lo

    @property
    def B(self) -> np.ndarray:
        return self.sums[1].lo

    def state(self, upper: bool = False) -> dict[str, Any]:
        """The sums and counters; ``upper`` (the stored form): A as its upper triangle ("A_upper",
        ridge_sums.upper_state) and the low words of A's triangle and of B in fewer bytes (narrow_words.py)."""
        out: dict[str, Any] = (upper and upper_state(self.sums[0], "A_upper")) or self.sums[0].state("A")
        for name, s in zip(("B", "C"), self.sums[1:]):
            out.update(s.state(name))
        if upper:
            narrow_all(out, ("A_upper", "B"))
        out.update({"t": self.t, "n_deletions": self.n_deletions, "epoch": self.epoch})
        if self.private is not None:
            out.update(self.private.state())
        return out

    def stored_state(self) -> dict[str, Any]:
        return self.state(upper=True)

    def load_state(self, state: Mapping[str, Any]) -> None:
        p, k = self.spec.dim + 1, self.grid.outputs
        shapes = {"A": (p, p), "B": (k, p), "C": (k,)}
        state = wide_all(state, {"A_upper": (p * (p + 1) // 2,), "B": (k, p)})
        if "A" not in state and "A_upper" in state:  # the stored form: A's upper triangle
            hi = state.get("A_upper_hi")
            lo, hi = from_upper(np.asarray(state["A_upper"]), None if hi is None else np.asarray(hi), p)
            state = {**state, "A": lo, **({} if hi is None else {"A_hi": hi})}
        sums = []
        for name in ("A", "B", "C")[: 3 if self.gcv else 2]:
            if name not in state:
                raise ValueError(f"stored state has no sum {name} (l2_selection gcv keeps C from creation)")
            lo, hi = np.asarray(state[name]), state.get(name + "_hi")
            if lo.shape != shapes[name] or lo.dtype != np.int64:
                raise ValueError("stored sums do not match the model's dimension, classes or type")
            sums.append(WideInt.load(lo, None if hi is None else np.asarray(hi)))
        self._sums = sums
        self.t = int(state["t"])
        self.n_deletions = int(state["n_deletions"])
        self.epoch = int(state["epoch"])
        if self.private is not None:
            self.private.load(state)
        self._published = None

    @property
    def step(self) -> int:
        return self.t

    def records_held(self) -> int:
        return self.t - self.n_deletions

    def learn_capacity(self) -> int | None:
        """The record cap (``record_cap`` records held), in retained mode the retained-record cap too, and for a
        private model none once its release_horizon is spent."""
        left = self.grid.record_cap - self.records_held()
        if self.private is not None and self.private.releases_left == 0:
            left = 0
        cap = super().learn_capacity()
        return max(0, left if cap is None else min(cap, left))

    def learn_capacity_field(self) -> str | None:
        """A private model's releases bound it (``release_horizon``); else the retained-record cap, if any (the int64
        sums' own cap is a constant of the family: ``constants.record_cap``)."""
        if self.private is not None and self.private.releases_left == 0:
            return "hyperparameters.release_horizon"
        return super().learn_capacity_field()

    def learn_refusal(self) -> str | None:
        if self.private is not None and self.private.releases_left == 0:
            return ("This model has made all the releases of its hyperparameters.release_horizon "
                    f"({self.private.horizon}): it publishes nothing more, so it learns nothing more. Create a new "
                    "model with a larger release_horizon (or a larger release_every: fewer releases for the same "
                    "stream), at the privacy cost charged for it; forgets are still accepted here, exact inside.")
        return None

    def constants(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {"mu": self.spec.l2, "x_grid_exponent": float(-self.grid.kx),
                                       "y_grid_exponent": float(-self.grid.ky), "record_cap": int(self.grid.record_cap)}
        if self.private is not None:
            out.update(self.private.constants())
        return out

    def ledger(self) -> dict[str, Any]:
        if self.private is not None:  # no deletion count: it is a record count (ridge_private.py)
            return self.private.ledger(self.spec)
        return {"accounting": self.accounting, "rho_spent": 0.0, "rho_budget": None,
                "capacity_total": None, "capacity_left": None, "deletions": self.n_deletions}

    def creation_charge(self) -> dict[str, float] | None:
        return None if self.private is None else self.private.creation_charge()

    # ---- learning and forgetting -------------------------------------------------------------------------------
    def _accumulate(self, X: np.ndarray, y: np.ndarray, sign: int) -> None:
        """Add or subtract the records' exact products; two words wherever the records held (plus the batch) times
        the per-record bound could reach 2^61 (ridge_sums.py)."""
        X = np.asarray(X, dtype=np.float64).reshape(len(y), self.spec.dim)
        sums = self.sums
        bound = (self.records_held() + (len(y) if sign > 0 else 0)) * self.grid.per_record
        wide = bound >= LO_LIMIT or any(s.hi is not None for s in sums)
        accumulate(self.grid, X, y, sums, sign, wide)

    def _write(self) -> None:
        """After each learn or forget request: the published weights change (private: at a release only)."""
        if self.private is None:
            self._published = None
        elif self.private.step(self.noise):
            self._published = None
            self.private.weights = self.weights()

    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        refusal = self.learn_refusal()
        if refusal is not None:
            raise InputError(refusal, code="horizon-reached")
        if len(y) > self.grid.record_cap - self.records_held():  # the service refuses first (learn_capacity)
            raise InputError(f"{self.algorithm} holds at most {self.grid.record_cap} records", code="horizon-reached")
        self._accumulate(X, y, 1)
        steps = np.arange(self.t + 1, self.t + 1 + len(y), dtype=np.int64)
        self.t += len(y)
        self._write()
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
        self._accumulate(X, np.asarray(y, dtype=np.float64).reshape(-1), -1)
        self._write()
        certs = []
        for u in steps:
            self.n_deletions += 1
            if self.private is None:
                certs.append(Certificate(learned_step=u, forgotten_step=self.t, deletion_index=self.n_deletions,
                                         mechanism="exact", sigma=0.0, sensitivity=0.0, rho=0.0))
            else:  # exact inside, nothing spent; no count in it (forgotten_step and deletion_index withheld: 0)
                certs.append(Certificate(learned_step=u, forgotten_step=0, deletion_index=0,
                                         mechanism="dp_from_start", sigma=self.private.sigma_a,
                                         sensitivity=self.private.sens_a, rho=0.0,
                                         details=self.private.certificate_details()))
        return certs

    def retrain(self, retained: RetainedData) -> None:
        """Retained mode: the sums rebuilt from the examples held (equal to the kept sums: a new ledger epoch; a
        private model releases nothing for it)."""
        p, k = self.spec.dim + 1, self.grid.outputs
        sums = [WideInt((p, p)), WideInt((k, p))] + ([WideInt((k,))] if self.gcv else [])
        wide = self.records_held() * self.grid.per_record >= LO_LIMIT
        for _, X, y in retained.chunks(CHUNK_SIZE):
            accumulate(self.grid, np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64).reshape(-1),
                       sums, 1, wide)
        self._sums = sums
        if self.private is None:
            self._published = None
        self.epoch += 1

    # ---- the published weights ---------------------------------------------------------------------------------------
    def _scaled(self, A: WideInt, B: WideInt) -> tuple[np.ndarray, np.ndarray]:
        """M = D A D and R = D B^T 2^-ky as float64 (D = diag(2^-k): the grid's scales, powers of two)."""
        if self._exponents is None:  # the grid's, from the spec alone; as powers of two where exact (ridge_sums)
            k = self.grid.exponents(self.spec.dim)
            self._exponents = (Scale(k, k), Scale(np.full(1, self.grid.ky), k))
        return self._exponents[0].apply(A.to_float()), self._exponents[1].apply(B.to_float())

    def weights(self) -> np.ndarray:
        """W (outputs x (d + 1)) from the sums alone (ridge_solve.py), deterministic in them.  A private model:
        from the current release's noisy sums (ridge_private.py)."""
        sums = self.sums
        if self.private is not None:
            A, B = self.private.noisy_sums(sums[0], sums[1])
            M, R = self._scaled(A, B)
            return self.private.solve(M, R, self.spec.l2)
        if self.gcv:
            return self._gcv()[0]
        M, R = self._scaled(sums[0], sums[1])
        M.flat[:: M.shape[0] + 1] += self.spec.l2
        return solve_spd(M, R, self.spec.l2)

    def _gcv(self) -> tuple[np.ndarray, float]:
        """(W, the penalty GCV chose) from the sums alone: yy = sum q(t)^2 2^-2ky from C, n from A's intercept
        corner (n 4^kc, exactly)."""
        sums = self.sums
        M, R = self._scaled(sums[0], sums[1])
        yy = float(np.ldexp(sums[2].to_float(), -2 * self.grid.ky).sum())
        n = float(sums[0].to_float()[-1, -1]) / 4.0**self.grid.kc
        return gcv_solve(M, R, yy, n, self.spec.l2)

    def penalty(self) -> float:
        """The ridge penalty the published weights use: l2, or GCV's choice (not published: tests and the bench)."""
        return self._gcv()[1] if self.gcv else self.spec.l2

    def noisy_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """A private model's current release's noisy sums as exact integers (object arrays; tests and the bench)."""
        if self.private is None:
            raise ValueError("only a private model has noisy sums")
        A, B = self.private.noisy_sums(self.sums[0], self.sums[1])
        return A.exact(), B.exact()

    def published(self) -> np.ndarray:
        if self._published is None:
            if self.private is not None:
                W = self.private.weights if self.private.weights is not None else np.zeros(
                    (self.grid.outputs, self.spec.dim + 1))
            else:
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
