"""The seeds' Table 1, measured: OLU regret and wall-clock cost per deletion of every served family vs T.

Run through ``python -m bench.regret`` (full: T = 10^3, 10^4, 10^5) or ``python -m bench.regret --quick``
(T = 10^3, 10^4).  Digest olu-online-learning-unlearning.md §3.5 ([000] Table 1, [001] Table 2) gives, for each
method, the order of its OLU regret and of its computation per deletion; this module measures both for every
family the service serves (app.unlearning.ALGORITHMS, passive_olu with two of its schedules, active_olu with both
variants) at T = 10^3 .. 10^5, k = 10 and 100, epsilon = 1, delta = 1e-6, and fits the log-log slope in T.

Protocol (identical for every family):

* Data: a synthetic stream from ``sklearn.datasets.make_classification`` (n = 10^5, d = 20, fixed seed),
  standardised and scaled row by row to the declared ||x|| = 1; T = 10^3 and 10^4 are prefixes of the 10^5 stream.
  digits even/odd (1797 x 64, the bundled data set long enough for T = 10^3) gives a real-data point at T = 10^3;
  breast-cancer (569 rows) is shorter than every T of the table and stays in the first table only.
* Model: L2-regularised logistic regression, mu = l2 = 0.01, K = ball of radius 12 (every comparator interior),
  epsilon = 1, delta = 1e-6, rho from the service's own conversion (app.privacy, CKS20), each spec normalised and
  checked by the family's ``check_calibration`` exactly as the service does at creation (so every sigma below is a
  certified one), noise from a seeded source (benchmark only): SEEDS noise seeds per cell (mean regret, its sd,
  cost over every deletion of every seed), one when a single run is projected above cap_s / SEED_SHARE.
* Deletions: the first table's schedule, k events at tau_i = round(i T / (k + 1)), each deleting the middle record
  of its block (so active OLU never needs its fallback).
* Online protocol: families that learn one example at a time are fed one example per ``learn`` call; the two
  batch-trained families (descent_to_delete, rewind_to_delete with ``learn_policy = "retrain"``) get the examples
  between two deletion events in one ``learn`` call (a data-holding batch learner that re-optimised per example
  would cost O(T^2) gradients).  The loss of example t is f_t(theta), theta the model published before t's
  ``learn`` call; OLU regret as in the first table (digest §1.6: dynamic comparator z*_i, L-BFGS).
* Cost per deletion: wall-clock median of ``engine.forget([u], retained)`` over the k deletions of the run (the
  retained view is built before the clock starts; data-holding families get it, as the service gives them).
  Its median deletion is at tau ~ T/2.
* Budget: before each T the run time is projected from the previous T (growth exponent >= 1); a run projected
  above ``cap_s`` is not run.  Its regret is then reported as not measured, and its cost per deletion is measured
  on a model that learned the first T/2 examples in one ``learn`` call (tau = T/2, the median deletion time of
  the full protocol) over ``FALLBACK_FORGETS`` deletions; the table footnotes name every such cell.

Slopes: least-squares slope of log(value) on log(T) over the measured T.  A regret <= 0 has no logarithm: its
slope is reported as n/a.  Predicted slopes are those of the T-dependent part of the papers' order term (terms
constant in T dropped, constants set to 1), evaluated locally over the same T range: log T has local slope ~0.11
over 10^3..10^5, not 0.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from app.privacy import rho_from_epsilon_delta
from app.unlearning import ALGORITHMS, ArrayRetained, ModelSpec
from app.unlearning.maths.losses import augment
from app.unlearning.mechanism.noise import SeededNoise

from ..common import projected_time
from .regret_common import MU, RADIUS, comparators, schedule

EPSILON, DELTA = 1.0, 1e-6
RHO = rho_from_epsilon_delta(EPSILON, DELTA, conversion="cks20")  # what the service charges (app/registry.py)
SIZES, QUICK_SIZES = (1_000, 10_000, 100_000), (1_000, 10_000)
KS = (10, 100)
SYN_N, SYN_D, SYN_SEED = 100_000, 20, 0
SEED = 0
SEEDS, SEED_SHARE = 3, 12  # noise seeds per cell when one run is projected at most cap_s / SEED_SHARE, else 1
CAP_S, QUICK_CAP_S = 240.0, 40.0  # per (family, k, T) projected run time
FALLBACK_FORGETS = 5
OFF_SCALE = 1e8  # regret above this is left out of the plot (it would flatten every other line); the table has it


def unit_rows(X: np.ndarray) -> np.ndarray:
    X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)


def synthetic(n: int = SYN_N, d: int = SYN_D, seed: int = SYN_SEED) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=n, n_features=d, n_informative=d // 2, n_redundant=d // 4, flip_y=0.05,
                               class_sep=1.0, random_state=seed)
    return unit_rows(X), y.astype(np.float64)


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    return unit_rows(X)[order], (y % 2 == 0).astype(np.float64)[order]


# ---- the papers' order terms ---------------------------------------------------------------------------------
LOG = lambda T, k: math.log(T)
CONST = lambda T, k: 1.0
LIN = lambda T, k: float(T)


@dataclass(frozen=True)
class Family:
    label: str
    algorithm: str
    hp: Callable[[int, int], dict]          # (T, k) -> hyperparameters
    regret_order: str                       # the papers' order term (digest §3.5 unless noted)
    regret_T: Callable[[int, int], float] | None  # its T-dependent part (None: no prediction)
    cost_order: str
    cost_T: Callable[[int, int], float] | None
    block: bool = False                     # batch-trained: one learn call per inter-deletion block
    # the linear score the table's logistic loss is taken of, from what the family publishes (None: as published);
    # exact_ridge publishes its K = 2 one-vs-rest rows, w_0 = -w_1: its class-1 row
    score_row: Callable[[np.ndarray], np.ndarray] | None = None


FAMILIES: tuple[Family, ...] = (
    Family("passive OLU (SC, capped)", "passive_olu", lambda T, k: {},
           "log T + d k^1.2/eps  [000 T1, SC]", LOG, "1", CONST),
    Family("passive, uniform budget (k known)", "passive_olu",
           lambda T, k: {"allocation": "uniform", "max_deletions": k},
           "log T + d k^1.2/eps  [000 T1, SC]", LOG, "1", CONST),
    Family("passive, regularised convex", "passive_olu",
           lambda T, k: {"schedule": "regularized_convex", "horizon": T, "max_deletions": k},
           "sqrt(T (log T + 2k))  [000 Thm 3.4, C]", lambda T, k: math.sqrt(T * (math.log(T) + 2 * k)),
           "1", CONST),
    Family("passive with restart", "passive_olu_restart", lambda T, k: {"horizon": T, "max_deletions": k},
           "sqrt(l T (log T + k))  [000 T1, C]", lambda T, k: math.sqrt(T * (math.log(T) + k)), "1", CONST),
    Family("active OLU (single)", "active_olu", lambda T, k: {"variant": "single"},
           "log T + k  [000 T1, SC + SGC]", LOG, "log tau  [000 T1: GD steps on one example]", LOG),
    Family("active OLU (two_phase)", "active_olu", lambda T, k: {"variant": "two_phase"},
           "log T + k^2 + G  [001 T2, SC + Ass. 2]", LOG,
           "log tau GD passes over tau examples  [001 T2; digest §3.5]", lambda T, k: T * math.log(T)),
    Family("second-order OLU", "second_order_olu", lambda T, k: {},
           "none (001 Alg. 3 has no theorem)", None, "tau d^2 + d^3  [digest §3.5]", LIN),
    Family("retrain (exact)", "retrain", lambda T, k: {},
           "log T  [T1, SC]", LOG, "tau  [T1]", LIN),
    Family("discard-and-restart", "discard_and_restart", lambda T, k: {},
           "k log T  [T1, SC]", LOG, "1  [T1]", CONST),
    Family("online DP tree (convex)", "online_dp_tree", lambda T, k: {"horizon": T, "max_deletions": k},
           "k sqrt(d T log^2.5 T)  [000 T1, C]", lambda T, k: math.sqrt(T * math.log(T) ** 2.5),
           "log tau  [T1; per round]", LOG),
    Family("descent-to-delete (secret)", "descent_to_delete", lambda T, k: {},
           "none (002 is a batch method)", None, "n I gradients  [002 §3]", LIN, block=True),
    Family("rewind-to-delete (R2D)", "rewind_to_delete", lambda T, k: {"learn_policy": "retrain"},
           "none (004 is a batch method)", None, "K b gradients  [004 Alg. 2]", CONST, block=True),
    Family("memory pair", "memory_pair", lambda T, k: {"capacity": max(k, 1)},
           "log T  [003, eta_t = 1/(lam t)]", LOG, "m d  [003: L-BFGS two-loop]", CONST),
    Family("SISA (exact, sharded)", "sisa", lambda T, k: {},
           "none (an ensemble of S OGD shards; the loss of its mean probability)", None,
           "tau / S  [Bourtoule et al. 2021: one shard replayed]", LIN),
    Family("exact ridge (least squares, exact)", "exact_ridge", lambda T, k: {"deletion_features": "retained"},
           "none (least squares on +-1 targets, scored by the logistic loss of its class-1 output)", None,
           "d^2 + one (d+1)^3 solve  [Cao & Yang 2015: summation form]", CONST,
           score_row=lambda w: w[w.size // 2:]),
)


def make_spec(algorithm: str, dim: int, hp: dict) -> ModelSpec:
    """The spec the service would build (defaults filled in, calibration checked at its worst case)."""
    cls = ALGORITHMS[algorithm]
    # a family that classifies with a loss of its own (exact_ridge: least squares) takes it, with 2 classes
    loss, k = (cls.classifier_losses[0], 2) if cls.classifier_losses else ("logistic", 0)
    s = ModelSpec(algorithm, loss, dim, 1.0, 1.0, RADIUS, MU, EPSILON, DELTA, RHO, dict(hp), n_classes=k)
    s = s.with_hyperparameters(cls.normalize_hyperparameters(s))
    cls.check_calibration(s)
    return s


def make_engine(fam: Family, dim: int, T: int, k: int, seed: int = SEED):
    return ALGORITHMS[fam.algorithm](make_spec(fam.algorithm, dim, fam.hp(T, k)), SeededNoise(seed))


def scored_losses(P: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """f_t(theta_t) for every row: the regularised logistic loss (declared l2 = MU), as Loss.losses computes it.
    An ensemble's row holds its members (sisa): the log-loss of their mean class-1 probability (what it predicts),
    plus the members' mean regulariser."""
    if P.shape[1] != X.shape[1] + 1:
        M = P.reshape(len(P), -1, X.shape[1] + 1)
        p1 = np.mean(1.0 / (1.0 + np.exp(-np.einsum("ij,imj->im", augment(X), M))), axis=1)
        return -np.log(np.where(y == 1, p1, 1.0 - p1)) + 0.5 * MU * np.mean(np.einsum("imj,imj->im", M, M), axis=1)
    s = np.einsum("ij,ij->i", augment(X), P)
    return np.logaddexp(0.0, s) - y * s + 0.5 * MU * np.einsum("ij,ij->i", P, P)


class _Scored:
    """An engine whose ``published`` is seen through a family's ``score_row`` (everything else passes through)."""

    def __init__(self, engine, score_row):
        self._engine, self._row = engine, score_row

    def published(self) -> np.ndarray:
        return self._row(self._engine.published())

    def __getattr__(self, name):
        return getattr(self._engine, name)


def run_stream(engine, X: np.ndarray, y: np.ndarray, events, block: bool,
               score_row=None) -> tuple[np.ndarray, list[float], list]:
    """Feed X, y; after step tau forget u (timed).  Returns (published model before each example, through
    ``score_row`` where given, forget seconds, certificates)."""
    T = len(X)
    if score_row is not None:
        engine = _Scored(engine, score_row)
    P = np.empty((T, engine.published().size))  # an ensemble publishes its members (sisa)
    alive = np.ones(T, dtype=bool)
    steps_all = np.arange(1, T + 1)
    needs = engine.needs_retained_data
    ev = dict(events)
    times, certs = [], []
    t = 0
    for cut in sorted(ev) + [T]:
        if cut > t:
            if block:
                P[t:cut] = engine.published()
                keep = alive[:t]
                retained = ArrayRetained(steps_all[:t][keep], X[:t][keep], y[:t][keep]) if needs else None
                engine.learn(X[t:cut], y[t:cut], retained)
            else:
                for s in range(t, cut):
                    P[s] = engine.published()
                    engine.learn(X[s:s + 1], y[s:s + 1])
            t = cut
        if cut in ev:
            u = ev[cut]
            keep = alive[:t]
            retained = ArrayRetained(steps_all[:t][keep], X[:t][keep], y[:t][keep]) if needs else None
            t0 = time.perf_counter()
            certs += engine.forget([u], retained)
            times.append(time.perf_counter() - t0)
            alive[u - 1] = False
    return P, times, certs


def fallback_cost(fam: Family, X: np.ndarray, y: np.ndarray, T: int, k: int, n_forgets: int) -> list[float]:
    """Cost per deletion without the full run: learn the first T/2 examples in one call, time ``n_forgets``
    deletions of records from the second half of that prefix."""
    n = max(2, T // 2)
    Xn, yn = X[:n], y[:n]
    eng = make_engine(fam, X.shape[1], T, k)
    retained0 = ArrayRetained(np.zeros(0, np.int64), np.zeros((0, X.shape[1])), np.zeros(0)) \
        if eng.needs_retained_data else None
    eng.learn(Xn, yn, retained0)
    steps = np.arange(1, n + 1)
    alive = np.ones(n, dtype=bool)
    times = []
    for u in np.random.default_rng(T).choice(np.arange(n // 2, n), size=n_forgets, replace=False):
        retained = ArrayRetained(steps[alive], Xn[alive], yn[alive]) if eng.needs_retained_data else None
        t0 = time.perf_counter()
        eng.forget([int(u) + 1], retained)
        times.append(time.perf_counter() - t0)
        alive[u] = False
    return times


def slope(Ts, values) -> float:
    """Least-squares slope of log(value) on log(T); nan when fewer than two points or a value <= 0."""
    pts = [(T, v) for T, v in zip(Ts, values) if v is not None and np.isfinite(v)]
    if len(pts) < 2 or any(v <= 0 for _, v in pts):
        return math.nan
    lt = np.log([p[0] for p in pts])
    lv = np.log([p[1] for p in pts])
    return float(np.polyfit(lt, lv, 1)[0])


def predicted_slope(fn, Ts, k) -> float | None:
    if fn is None:
        return None
    return slope(Ts, [fn(T, k) for T in Ts])


@dataclass
class Cell:
    regret: float | None = None
    regret_sd: float | None = None    # sd over the noise seeds (None: one seed)
    seeds: int = 1
    cost_s: float | None = None       # median seconds per deletion
    n_timed: int = 0
    fallback: bool = False            # regret not measured; cost from the fallback protocol
    run_s: float = 0.0
    sigma: float = 0.0                # mean certificate sigma per deletion
    note: str = ""


@dataclass
class Row:
    family: Family
    k: int
    cells: dict[int, Cell] = field(default_factory=dict)   # T -> Cell
    digits: Cell | None = None

    def regret_slope(self) -> float:
        Ts = sorted(self.cells)
        return slope(Ts, [self.cells[T].regret for T in Ts])

    def cost_slope(self) -> float:
        Ts = sorted(self.cells)
        return slope(Ts, [self.cells[T].cost_s for T in Ts])


def measure(fam: Family, X, y, events, T: int, k: int, comp: np.ndarray, seeds: int = 1) -> Cell:
    """``seeds`` runs with noise seeds SEED, SEED + 1, ...: mean regret (and its sd), median cost over every
    deletion of every run; ``run_s`` is the time of one run."""
    t0 = time.perf_counter()
    regrets, times, certs = [], [], []
    for seed in range(SEED, SEED + seeds):
        eng = make_engine(fam, X.shape[1], T, k, seed)
        P, tm, cs = run_stream(eng, X, y, events, fam.block, fam.score_row)
        regrets.append(float(scored_losses(P, X, y).sum() - comp.sum()))
        times += tm
        certs += cs
    return Cell(regret=float(np.mean(regrets)), regret_sd=float(np.std(regrets)) if seeds > 1 else None,
                seeds=seeds, cost_s=float(statistics.median(times)) if times else None, n_timed=len(times),
                run_s=(time.perf_counter() - t0) / seeds,
                sigma=float(np.mean([c.sigma for c in certs])) if certs else 0.0)


def run(sizes=SIZES, ks=KS, families=FAMILIES, cap_s: float = CAP_S, data=None, with_digits: bool = True,
        log=print, seeds: int = SEEDS) -> dict:
    """Measure every (family, k, T).  ``data`` = (X, y) overrides the synthetic stream (tests).  A cell gets
    ``seeds`` noise seeds when its projected single run takes at most ``cap_s`` / SEED_SHARE, else one."""
    start = time.perf_counter()
    X_all, y_all = data if data is not None else synthetic(max(SYN_N, max(sizes)))
    warm = FAMILIES[0]  # compile / load the numba kernels before any timing
    run_stream(make_engine(warm, X_all.shape[1], 100, 1), X_all[:100], y_all[:100], [(50, 25)], False)
    rows = [Row(f, k) for k in ks for f in families]
    comp_s = 0.0
    for k in ks:
        history: dict[str, list[tuple[int, float]]] = {f.label: [] for f in families}
        for T in sizes:
            X, y = X_all[:T], y_all[:T]
            events = schedule(T, k)
            t0 = time.perf_counter()
            comp = comparators(X, y, events)
            comp_s += time.perf_counter() - t0
            for row in rows:
                if row.k != k:
                    continue
                fam = row.family
                hist = history[fam.label]
                projected = projected_time(hist, T)
                if projected > cap_s:
                    times = fallback_cost(fam, X, y, T, k, FALLBACK_FORGETS)
                    row.cells[T] = Cell(cost_s=float(statistics.median(times)), n_timed=len(times), fallback=True,
                                        note=f"projected {projected:.0f} s > cap {cap_s:.0f} s")
                    log(f"  {fam.label:36s} k={k:<4d} T={T:<7d} fallback (projected {projected:.0f} s): "
                        f"cost {row.cells[T].cost_s:.3g} s")
                    continue
                n_seeds = seeds if projected * SEED_SHARE <= cap_s else 1
                cell = measure(fam, X, y, events, T, k, comp, n_seeds)
                hist.append((T, cell.run_s))
                row.cells[T] = cell
                log(f"  {fam.label:36s} k={k:<4d} T={T:<7d} regret {cell.regret:10.1f}  cost {cell.cost_s:.3g} s  "
                    f"run {cell.run_s:.1f} s")
    if with_digits:
        Xd, yd = digits()
        T = 1_000
        Xd, yd = Xd[:T], yd[:T]
        for k in ks:
            events = schedule(T, k)
            comp = comparators(Xd, yd, events)
            for row in rows:
                if row.k == k:
                    row.digits = measure(row.family, Xd, yd, events, T, k, comp, seeds)
    return {"rows": rows, "sizes": list(sizes), "ks": list(ks), "elapsed_s": time.perf_counter() - start, "seeds": seeds,
            "comparator_s": comp_s, "cap_s": cap_s, "d": X_all.shape[1], "with_digits": with_digits}


