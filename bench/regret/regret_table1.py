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


# ---- output --------------------------------------------------------------------------------------------------
def _pow10(T: int) -> str:
    e = math.log10(T)
    return f"10^{e:.0f}" if abs(e - round(e)) < 1e-9 else str(T)


def _fmt_cost(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _fmt_regret(c: Cell) -> str:
    v = f"{c.regret:.3g}" if abs(c.regret) >= 1e6 else f"{c.regret:.1f}"
    if c.regret_sd is None:
        return v + " ¹" if c.seeds == 1 else v
    return v + (f" ({c.regret_sd:.2g})" if c.regret_sd >= 1e6 else f" ({c.regret_sd:.1f})")


def _fmt_slope(v: float | None) -> str:
    if v is None:
        return "-"
    return "n/a" if not np.isfinite(v) else f"{v:+.2f}"


def markdown(res: dict) -> list[str]:
    sizes, rows = res["sizes"], res["rows"]
    notes: list[str] = []

    def mark(row: Row, T: int) -> str:
        c = row.cells[T]
        if not c.fallback:
            return ""
        notes.append(f"{row.family.label}, k = {row.k}, T = {_pow10(T)}: regret not measured ({c.note}); cost per "
                     f"deletion from {c.n_timed} deletions after learning the first T/2 examples in one call")
        return f" [{len(notes)}]"

    head_T = " | ".join(f"T = {_pow10(T)}" for T in sizes)
    out = ["### Table 1a: OLU regret", "",
           f"| family | k | {head_T} | digits T = 10^3 | measured slope | papers' order term | predicted slope |",
           "|---|---|" + "---|" * len(sizes) + "---|---|---|---|"]
    for row in rows:
        vals = []
        for T in sizes:
            c = row.cells.get(T)
            vals.append("-" if c is None else ("not run" + mark(row, T)) if c.regret is None else _fmt_regret(c))
        dg = _fmt_regret(row.digits) if row.digits and row.digits.regret is not None else "-"
        out.append(f"| {row.family.label} | {row.k} | " + " | ".join(vals) + f" | {dg} | "
                   f"{_fmt_slope(row.regret_slope())} | {row.family.regret_order} | "
                   f"{_fmt_slope(predicted_slope(row.family.regret_T, sizes, row.k))} |")
    out += ["", "### Table 1b: wall-clock cost per deletion (median over the run's deletions)", "",
            f"| family | k | {head_T} | digits T = 10^3 | measured slope | papers' order term | predicted slope |",
            "|---|---|" + "---|" * len(sizes) + "---|---|---|---|"]
    for row in rows:
        vals = []
        for T in sizes:
            c = row.cells.get(T)
            vals.append("-" if c is None else _fmt_cost(c.cost_s) + (" *" if c.fallback else ""))
        dg = _fmt_cost(row.digits.cost_s) if row.digits else "-"
        out.append(f"| {row.family.label} | {row.k} | " + " | ".join(vals) + f" | {dg} | "
                   f"{_fmt_slope(row.cost_slope())} | {row.family.cost_order} | "
                   f"{_fmt_slope(predicted_slope(row.family.cost_T, sizes, row.k))} |")
    out.append("")
    if notes:
        out += ["Not measured in full (the budget rule of the methodology; `*` in Table 1b marks these costs):", ""]
        out += [f"{i}. {n}" for i, n in enumerate(notes, 1)]
        out.append("")
    return out


def plot(res: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = res["ks"]
    fig, axes = plt.subplots(2, len(ks), figsize=(6.5 * len(ks), 10), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for c, k in enumerate(ks):
        for j, row in enumerate(r for r in res["rows"] if r.k == k):
            Ts = sorted(row.cells)
            style = {"color": cmap(j % 20), "marker": "osD^v<>ph*XP8"[j % 13], "label": row.family.label}
            pts = [(T, row.cells[T].regret) for T in Ts
                   if row.cells[T].regret is not None and 0 < row.cells[T].regret <= OFF_SCALE]
            if pts:
                axes[0][c].plot(*zip(*pts), **style)
            pts = [(T, row.cells[T].cost_s) for T in Ts if row.cells[T].cost_s]
            if pts:
                axes[1][c].plot(*zip(*pts), linestyle="--" if any(row.cells[T].fallback for T in Ts) else "-",
                                **style)
        axes[0][c].set_title(f"OLU regret, k = {k} (values <= 0 or > {OFF_SCALE:.0e} not drawn)")
        axes[1][c].set_title(f"cost per deletion, k = {k} (dashed: a fallback point)")
        axes[0][c].set_ylabel("OLU regret")
        axes[1][c].set_ylabel("seconds per deletion (median)")
        for r in (0, 1):
            ax = axes[r][c]
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("T")
            ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# Why a measured slope departs from the papers' order term, per family (written from the full run's numbers;
# ``document`` prints the note of every row whose slope departs by more than DISAGREE and flags rows with none).
DISAGREE = 0.2
def passive_sc_bound(T: int, k: int, d: int) -> float:
    """[000] Thm 3.3 (with the L^2 its proof drops, digest §3.3) in this service's zCDP form: OGD's
    (L^2/mu)(1 + log T + 2(k - 1)) plus sum_i E||xi_i||^2 / (2 eta_tau_i) = d sigma_i^2 mu tau_i / 2,
    sigma_i = sqrt(omega i^omega / (2 (omega - 1) rho)) L / (mu tau_i), omega = 1.2 (d + 1 parameters)."""
    from app.unlearning.maths.losses import make_loss

    L = make_loss("logistic", 1.0, 1.0, RADIUS, MU, {}).lipschitz
    om = 1.2
    noise = sum((d + 1) * om * i ** om * L ** 2 / (4 * (om - 1) * RHO * MU * tau)
                for i, (tau, _) in enumerate(schedule(T, k), 1))
    return L ** 2 / MU * (1 + math.log(T) + 2 * (k - 1)) + noise


def _why_passive(res: dict) -> str:
    d, sizes = res["d"], res["sizes"]
    vals = "; ".join(f"k = {k}: " + ", ".join(f"{passive_sc_bound(T, k, d):.3g}" for T in sizes) for k in res["ks"])
    return ("The order term drops constants that dominate here. [000] Thm 3.3 with this run's constants "
            f"(L^2/mu = 235, d = {d + 1}, rho = {RHO:.4f}) bounds the regret by {vals} at T = "
            + ", ".join(_pow10(T) for T in sizes) + ": above every measured value, and *decreasing* in T at fixed k "
            "(its noise term is sum_i i^1.2/tau_i with tau_i proportional to T), which the table's 'log T + "
            "d k^1.2/eps' (tau_i >= i) hides. The certified noise sqrt(d) sigma_i is as large as the domain radius "
            "for the early deletions, and OGD's step 1/(mu t) at t ~ tau is too short to walk back within the "
            "T/(k+1) examples before the next deletion, so with k = 100 the model spends most blocks far from z*_i "
            "and the regret grows nearly linearly; with k = 10 the blocks are long enough at 10^5 to recover, and "
            "the regret falls as the bound does. The uniform budget (rho/k per deletion) is the same mechanism "
            "with less noise per late deletion.")


# A callable gets the run's results (for numbers computed from them).
WHY_REGRET: dict[str, object] = {
    "passive OLU (SC, capped)": _why_passive,
    "passive, uniform budget (k known)": "As passive OLU (above): the same noise mechanism, split rho/k.",
    "passive, regularised convex": (
        "Its order term is an upper bound: a slope below it does not contradict [000] Thm 3.4. The surrogate's "
        "lambda = sqrt((log T + 2k)/T) shrinks with T, so its bias towards 0 (first table) fades as T grows while "
        "the noise, as for passive OLU, is large for early deletions; the two effects partly cancel."),
    "passive with restart": (
        "[000] Cor 3.6's sqrt(l T (log T + k)) with l restarts. At k = 100 the test of 000 Alg. 3 line 5 "
        "(c = 1) restarts at every deletion and every T (l = 100), so each epoch is a fresh game of T/101 "
        "examples, in the same pre-asymptotic regime as discard-and-restart (below): the slope exceeds 1/2. "
        "(At k = 10 it restarts at all 10 deletions for T = 10^3 and 10^4 and at none for T = 10^5, where it adds "
        "noise instead; counted from the certificates' mechanisms.)"),
    "active OLU (single)": (
        "[000] Thm 4.2 needs the strong growth condition (all retained losses share a minimiser, digest P13), "
        "which real and synthetic classification data violate: ~200 GD steps on ONE anchor example pull the model "
        "to that example's minimiser, so every block starts far from z*_i and the regret grows linearly with the "
        "block length T/(k+1). The unlearning certificate does not depend on SGC; the regret bound does."),
    "discard-and-restart": (
        "k log T is the asymptotic sum of k + 1 fresh OGD games. Each epoch here is T/(k+1) examples long and "
        "restarts at theta = 0 with the step clock reset; with mu = 0.01, OGD needs hundreds of steps to reach the "
        "comparator, so at k = 100 (epochs of 10 to 1000 examples) each epoch's regret still grows roughly "
        "linearly with its length; at k = 10 the epochs are long enough for the log regime."),
    "online DP tree (convex)": (
        "At k = 100 the order term k sqrt(d T log^2.5 T), even with constants 1 (1.6e5 at T = 10^3, 3.1e6 at "
        "10^5), exceeds the trivial bound T x the largest loss on K (~17 T here), so it carries no information: "
        "Proposition 1 makes sigma grow like k^1.29 and the whole budget is paid from the first step, the play "
        "stays close to the noise-dominated FTRL point, and the regret is linear in T. At k = 10 the measured "
        "slope is below the bound's."),
    "memory pair": (
        "The draft's log T regret is for learning without deletions. Each deletion adds noise "
        "sigma = (L/lam)/(n - 1) sqrt(m/(2 rho)) with m = capacity = k, i.e. the passive mechanism with a "
        "1/n sensitivity: at k = 100 sqrt(d) sigma is comparable to the domain radius for the early deletions and "
        "the model does not recover within a block (as passive OLU); at k = 10 it does at 10^5."),
}
WHY_COST: dict[str, object] = {
    "passive OLU (SC, capped)": (
        "The O(1) forget (a noise draw) is timed in the run, right after T/(k+1) learn calls, i.e. cold: after "
        "learning 10^5 examples in one call, the first passive forget took 138 us and the next nine, back to back, "
        "14-25 us (same engine, same n). The longer the block before a deletion, the colder the call; bench.forget "
        "times warm back-to-back forgets. The same holds for every O(1) family below."),
    "passive, uniform budget (k known)": "Cold-cache timing of an O(1) forget, as passive OLU.",
    "passive, regularised convex": "Cold-cache timing of an O(1) forget, as passive OLU.",
    "passive with restart": "Cold-cache timing of an O(1) forget, as passive OLU.",
    "discard-and-restart": "Cold-cache timing of an O(1) forget (a reset to 0), as passive OLU.",
    "online DP tree (convex)": "Its forget does nothing (the budget was paid at creation): cold-cache timing, as passive OLU.",
    "active OLU (two_phase)": (
        "Each GD pass is one numpy matrix-vector product over tau x (d + 1) floats, whose fixed cost dominates "
        "at tau ~ 500; the slope between 10^4 and 10^5 is closer to the predicted one."),
    "second-order OLU": (
        "Its GD phase length K is planned from public constants and grows like log n (planned_gd_steps: 328 steps "
        "at n = 10^3, 445 at 10^4, 528 at 5 10^4) so the cost is ~ n log n, plus the Hessian assembly; the "
        "retained set (n x 21 floats) also leaves the CPU caches above ~10^4 rows, which may add the rest. This "
        "slope is also the least stable between runs (below)."),
    "rewind-to-delete (R2D)": (
        "The K SGD steps cost O(K b d), independent of n, but the forget also enumerates the retained step ids "
        "(the SGD pool, rewind._Pool) in O(n): small at these n, visible in the slope."),
    "memory pair": "Cold-cache timing plus the O(log n) lookup of the deleted record's features.",
    "active OLU (single)": "Its GD phase (O(log tau) steps on one example) is a few ms; timing noise.",
}


RUN_TO_RUN = (
    "two full runs on 2026-11-25 (the first with one noise seed per cell), on the 2-core machine shared with "
    "other jobs (load average 5-7), gave regret slopes within 0.06 of each other and cost slopes within a "
    "median 0.06, at most 0.29 (second-order OLU, whose k = 100, T = 10^5 fallback cell took 1.17 s per deletion "
    "in the first run and 4.46 s in the second). Cost slopes that differ by less than ~0.3 are not significant "
    "here.")


def disagreements(res: dict) -> list[tuple[str, str, int, float, float]]:
    """(kind, family label, k, measured, predicted) of every slope more than DISAGREE from its prediction."""
    out = []
    for row in res["rows"]:
        for kind, measured, fn in (("regret", row.regret_slope(), row.family.regret_T),
                                   ("cost", row.cost_slope(), row.family.cost_T)):
            pred = predicted_slope(fn, res["sizes"], row.k)
            if pred is None:
                continue
            if not np.isfinite(measured) or abs(measured - pred) > DISAGREE:
                out.append((kind, row.family.label, row.k, measured, pred))
    return out


def document(res: dict) -> list[str]:
    sizes = res["sizes"]
    lines = [
        "## Table 1, measured: regret and cost per deletion of every family vs T",
        "",
        "The seeds' Table 1 ([000] Table 1, [001] Table 2; digest §3.5) gives order terms only: neither paper",
        "has an experiment (digest §4). Below, every family the service serves is run on the same stream with the",
        "same deletions, at " + ", ".join(f"T = {_pow10(T)}" for T in sizes) + ", k = " +
        " and ".join(str(k) for k in res["ks"]) + f" deletions, epsilon = {EPSILON:g}, delta = {DELTA:g}.",
        "Generated by `python -m bench.regret` (module `bench/regret_table1.py`; its docstring has every choice).",
        "",
        "Methodology:",
        "",
        (f"* Data: `make_classification(n = {SYN_N}, d = {res['d']}, n_informative = {res['d'] // 2}, "
         f"n_redundant = {res['d'] // 4}, flip_y = 0.05, random_state = {SYN_SEED})`, standardised, each row"),
        "  scaled to the declared ||x|| = 1; each T is a prefix of the same stream. The digits column is the bundled",
        "  digits even/odd set (first 10^3 rows of the first table's order); breast-cancer (569 rows) is shorter than",
        "  every T and appears in the first table only.",
        f"* Model: logistic, l2 = mu = {MU}, R = {RADIUS}, rho = {RHO:.5f} (the service's CKS20 conversion of",
        "  (1, 1e-6); the first table keeps its older rho = 0.01747). Each spec is normalised and passed through",
        "  the family's `check_calibration`, as the service does at creation: every sigma is a certified one, from",
        f"  the real engine (`app.unlearning`), with seeded noise: {res.get('seeds', 1)} seeds per cell (regret: mean",
        "  (sd); cost: median over every deletion of every seed), one seed (marked ¹) where a single run is",
        f"  projected above {res['cap_s'] / SEED_SHARE:.0f} s. rewind-to-delete draws its minibatches from the OS CSPRNG",
        "  (the service's sampler), so it is not reproducible run to run.",
        "* Family settings: service defaults, plus what the family must be told: `horizon` = T and",
        "  `max_deletions` = k where the family takes them (uniform budget, regularised convex, restart, online DP",
        "  tree), `capacity` = k (memory pair), `learn_policy = retrain` (rewind-to-delete, so that it learns the",
        "  stream at all; with the default `queue` it would keep its first fit). The passive schedules `convex_constant`",
        "  and `adaptive` (first table) are left out: their regret theorems need a step tuned to T and k.",
        "* Deletions: k events at tau_i = round(i T/(k+1)), each deleting the middle record of its block.",
        "* Online protocol: one example per `learn` call, except the two batch-trained families (descent-to-delete,",
        "  rewind-to-delete), which get the examples between two deletion events in one call. The loss of example",
        "  t is f_t(theta) for the model published before t's `learn` call. OLU regret = sum of these losses minus",
        "  the dynamic comparator's (digest §1.6; z*_i by L-BFGS, as in the first table).",
        "* Cost per deletion: median wall-clock time of `engine.forget([u], retained)` over the run's k deletions",
        "  (median deletion at tau ~ T/2); the retained view is built before the clock starts. Engine level, no",
        "  HTTP or database; this machine has 2 cores shared with other jobs, so costs below ~50 us are noisy.",
        f"* Budget: a (family, k, T) run projected above {res['cap_s']:.0f} s from its smaller T is not run; its cost",
        f"  is then the median of {FALLBACK_FORGETS} deletions after learning the first T/2 examples in one call (same",
        "  tau as the full run's median deletion), and its regret is reported as not run (footnotes).",
        "* Slopes: least-squares slope of log(value) on log(T) over the measured T. Predicted slope: the same fit",
        "  applied to the T-dependent part of the papers' order term with constants set to 1 (terms constant in T",
        f"  dropped); log T has local slope {predicted_slope(LOG, sizes, 1):.2f} over this range, not 0. A regret <= 0",
        "  has no logarithm (n/a).",
        "",
    ]
    lines += markdown(res)
    lines += ["![Table 1: regret and cost per deletion vs T](regret_table1.png)", "",
              "### Where the measured slopes disagree with the papers' order terms", "",
              "The papers' order terms are upper bounds up to constants. A measured slope below the predicted",
              "one does not contradict them; one above it contradicts them only asymptotically, and the constants",
              "they drop are large at these settings (L^2/mu = 235 for every strongly convex bound). Rows whose",
              f"measured slope is more than {DISAGREE} from the predicted one (n/a counts as a disagreement):", ""]
    grouped: dict[tuple[str, str], list[str]] = {}
    for kind, label, k, measured, pred in disagreements(res):
        grouped.setdefault((kind, label), []).append(
            f"k = {k}: measured {_fmt_slope(measured)}, predicted {_fmt_slope(pred)}")
    for (kind, label), parts in sorted(grouped.items(), key=lambda kv: (kv[0][0] != "regret", kv[0][1])):
        why = (WHY_REGRET if kind == "regret" else WHY_COST).get(label, "(no explanation recorded)")
        why = why(res) if callable(why) else why
        lines.append(f"* **{label}**, {kind} ({'; '.join(parts)}). {why}")
    lines += ["", "No prediction to compare with: second-order OLU (001 Alg. 3 has no theorem), descent-to-delete and",
              "rewind-to-delete (batch methods, papers 002 and 004 bound excess risk, not regret). rewind-to-delete's",
              "regret is the release noise: its certified sigma at these bounds (mu = 0.01, the theorem's step size",
              "cap) is 10^4 to 10^8 in every setting we tried (default K = T/4, K up to 0.8 T, T up to 2 10^4,",
              "batch 256, the convex regime, the descend variant), so each published model is far outside K and its",
              "slope means nothing: the bound on the expected distance to the retrain goes through Markov's",
              "inequality (004 Lemma 13), so the Gaussian is calibrated on Sigma/(delta/2). Its `sigma_target`",
              "hyperparameter (K picked for a target noise; refused at creation until this run found it, now fixed)",
              "does not help at delta = 1e-6: a useful target makes it pick K = T, a full retrain (docs/accuracy.md).",
              "",
              "Run to run: " + RUN_TO_RUN,
              "", f"Runtime of Table 1: {res['elapsed_s']:.0f} s (comparators {res['comparator_s']:.0f} s).", ""]
    return lines


def snapshot(res: dict) -> dict:
    """``res`` without the families' callables (pickled by ``python -m bench.regret`` for ``--render``)."""
    rows = [{"label": r.family.label, "k": r.k, "cells": r.cells, "digits": r.digits} for r in res["rows"]]
    return {**res, "rows": rows}


def restore(snap: dict) -> dict:
    by_label = {f.label: f for f in FAMILIES}
    rows = [Row(by_label[r["label"]], r["k"], r["cells"], r["digits"]) for r in snap["rows"]]
    return {**snap, "rows": rows}
