"""Section ``accuracy``: held-out accuracy before and after forgetting, every family, beside the exact retrain
and river's single-pass logistic regression (``python -m bench --sections accuracy``; docs/accuracy.md).

Protocol (identical for every family and reference):

* Data sets are entries of ``DATASETS``.  Each names its loss and its feature encoding; an entry whose loss or
  feature encoding this build of the engine does not serve is skipped with the reason printed (``unsupported``).
  Features are made to fit the declared bound ``x_norm = 1`` by per-record operations or declared ranges only
  (see each loader): the only statistics ever taken are the training split's per-column mean and standard
  deviation of the dense numeric data sets (a client's fixed preprocessing, decided before the stream starts).
* Fixed split (the last ``TEST_FRACTION`` of one seeded permutation is held out) and fixed stream order (that
  permutation).  Every model learns the training stream in requests of ``BATCH`` examples, in that order.
* Scenario "end": after the stream it forgets one record, then (cumulatively) 1 % and 10 % of the training
  records, one record per request, drawn at random with a fixed seed (the same records for every family and
  every noise seed).  Held-out accuracy is measured before any forget and at each of the three milestones.
* Scenario "during": as many forget requests (1 record, 1 %, 10 %; one run each) spread evenly through the
  stream, each for a random record learned so far (``during_plan``); held-out accuracy at the end of the stream.
* Privacy target epsilon = 1, delta = 1e-6 (rho by the service's own conversion), ``domain_radius`` and ``l2`` as
  the service's defaults (``MODEL_DEFAULTS``); every family runs with its default hyperparameters except those
  the user must declare (a horizon, a deletion capacity): those get the true stream length and the true number
  of forgets (``declared``).  Noisy families are averaged over ``SEEDS`` noise seeds (``SeededNoise``; the
  service draws from a CSPRNG, the distribution is the same); the table shows the mean and the spread (min-max).
* References, on the same encoded features and the same order: the *exact retrain* (a fresh, noise-free model
  of the ``retrain`` family -- the passive family's OGD and schedule -- learned from scratch on the remaining
  records), river 0.26's ``LogisticRegression`` (``SoftmaxRegression`` for more than two classes) with its
  defaults, one pass ``learn_one`` in stream order, and scikit-learn's batch ``LogisticRegression`` with the same
  l2 (C = 1/(l2 n)): the full-batch optimum, a ceiling for any single pass.

A family that refuses a forget (capacity exhausted, record not deletable) reports ``refused after k`` for the
milestones it did not reach.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from app.privacy import rho_from_epsilon_delta
from app.unlearning import ALGORITHMS, ArrayRetained, CapacityExhausted, ForgetError, ModelSpec, SeededNoise, SpecError

from .datasets import (BATCH, DATASETS, DELTA, EPSILON, FORGET_SEED, FRACTIONS, MILESTONES, MODEL_DEFAULTS, SEEDS,
                       Entry, Prepared, marks, unsupported)

# ---- models ------------------------------------------------------------------------------------------------
RHO = rho_from_epsilon_delta(EPSILON, DELTA)


def declared(algorithm: str, n_train: int, n_forget: int) -> dict[str, Any]:
    """The hyperparameters a user must declare for a family (no default exists): the stream length and the
    number of deletions, given their true values.  Everything else stays at the family's default."""
    cls = ALGORITHMS[algorithm]
    loss, classes = family_loss(algorithm, "logistic", 2)
    try:  # families whose defaults are enough: nothing declared
        cls.normalize_hyperparameters(ModelSpec(algorithm, loss, 2, 1.0, 1.0, MODEL_DEFAULTS["domain_radius"],
                                                MODEL_DEFAULTS["l2"], EPSILON, DELTA, RHO, {}, n_classes=classes))
        base: dict[str, Any] = {}
    except SpecError:
        base = {"horizon": max(2, n_train), "max_deletions": max(1, n_forget)}
    if algorithm == "rewind_to_delete":  # capacity and the first training's size (defaults 10 and 256)
        base.update(m_max=max(1, n_forget), initial_size=max(2, n_train))
    if algorithm == "memory_pair":  # capacity (default 32)
        base.update(capacity=max(1, n_forget))
    return base


def family_loss(algorithm: str, loss: str, classes: int) -> tuple[str, int]:
    """(loss, n_classes) a family runs a classification task with: the data set's loss (softmax: K classes); a
    family that classifies with a loss of its own (``classifier_losses``: exact_ridge's least squares on +-1
    targets) takes that loss with the data set's K classes (2 for the binary sets)."""
    own = ALGORITHMS[algorithm].classifier_losses
    if own and loss in ("logistic", "softmax"):
        return own[0], classes
    return loss, (classes if loss == "softmax" else 0)


def model_spec(algorithm: str, dim: int, loss: str, classes: int, hp: dict[str, Any], x_norm: float = 1.0,
               **fields: float) -> ModelSpec:
    """The spec the service would build for this family with the default spec fields and ``hp``.
    (softmax, or a family's own classifier loss: the number of classes K goes to the spec's ``n_classes``.)"""
    radius = fields.get("domain_radius", MODEL_DEFAULTS["domain_radius"])
    l2 = fields.get("l2", MODEL_DEFAULTS["l2"])
    loss, n_classes = family_loss(algorithm, loss, classes)
    extra = {"n_classes": n_classes} if n_classes else {}
    s = ModelSpec(algorithm=algorithm, loss=loss, dim=dim, x_norm=x_norm, y_abs=1.0, domain_radius=radius, l2=l2,
                  epsilon=EPSILON, delta=DELTA, rho=RHO, hyperparameters=dict(hp), **extra)
    return s.with_hyperparameters(ALGORITHMS[algorithm].normalize_hyperparameters(s))


def _accuracy(engine, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(engine.predict(X)[0] == y))


def _retained(steps: np.ndarray, X: np.ndarray, y: np.ndarray, alive: np.ndarray) -> ArrayRetained:
    return ArrayRetained(steps[alive], X[alive], y[alive])


def run_family(algorithm: str, data: Prepared, loss: str, forget_order: np.ndarray, seed: int,
               hp: dict[str, Any] | None = None, **fields: float) -> dict[str, Any]:
    """Learn the stream, forget ``forget_order`` one record per request; held-out accuracy at each milestone."""
    cls = ALGORITHMS[algorithm]
    Xtr, ytr = data.X_train, data.y_train
    n, d = Xtr.shape
    n_marks = marks(n)
    hp = declared(algorithm, n, n_marks[-1]) if hp is None else hp
    spec = model_spec(algorithm, d, loss, data.classes, hp, data.x_norm, **fields)
    engine = cls(spec, SeededNoise(seed))
    holds = cls.needs_retained_data or getattr(engine, "needs_retained_data", False)
    steps = np.zeros(n, dtype=np.int64)
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        stop = min(start + BATCH, n)
        ret = _retained(steps[:start], Xtr[:start], ytr[:start], np.ones(start, bool)) if holds else None
        steps[start:stop] = engine.learn(Xtr[start:stop], ytr[start:stop], ret)
    out: dict[str, Any] = {"before": _accuracy(engine, data.X_test, data.y_test), "learn_s": time.perf_counter() - t0}
    alive = np.ones(n, dtype=bool)
    t0 = time.perf_counter()
    done = 0
    sigmas: list[float] = []
    mechanisms: set[str] = set()
    for mark, label in zip(n_marks, MILESTONES[1:]):
        try:
            while done < mark:
                u = int(forget_order[done])
                ret = _retained(steps, Xtr, ytr, alive) if holds else None
                if getattr(engine, "needs_deletion_features", False):
                    ret = ArrayRetained(steps[u:u + 1], Xtr[u:u + 1], ytr[u:u + 1])
                for c in engine.forget([int(steps[u])], ret):
                    sigmas.append(float(c.sigma))
                    mechanisms.add(str(c.mechanism))
                alive[u] = False
                done += 1
            out[label] = _accuracy(engine, data.X_test, data.y_test)
        except (CapacityExhausted, ForgetError) as e:
            out["refused"] = f"refused after {done} forgets: {type(e).__name__}"
            break
    out["forget_s"] = time.perf_counter() - t0
    out["sigma_mean"] = float(np.mean(sigmas)) if sigmas else 0.0
    out["mechanisms"] = sorted(mechanisms)
    return out


def during_plan(n: int, k: int) -> list[tuple[int, int]]:
    """Scenario "during": k forget requests spread evenly through the stream, at tau_i = round(i n / (k + 1)), each
    for a record drawn uniformly (fixed seed) among those learned so far and not yet forgotten: [(tau_i, index)]."""
    rng = np.random.default_rng(FORGET_SEED)
    alive = np.ones(n, dtype=bool)
    plan = []
    for i in range(1, k + 1):
        tau = max(1, round(i * n / (k + 1)))
        u = int(rng.choice(np.flatnonzero(alive[:tau])))
        alive[u] = False
        plan.append((tau, u))
    return plan


def run_during(algorithm: str, data: Prepared, loss: str, plan: list[tuple[int, int]], seed: int,
               hp: dict[str, Any] | None = None, **fields: float) -> dict[str, Any]:
    """Learn the stream with the forget requests of ``plan`` interleaved; held-out accuracy at the end."""
    cls = ALGORITHMS[algorithm]
    Xtr, ytr = data.X_train, data.y_train
    n, d = Xtr.shape
    hp = declared(algorithm, n, len(plan)) if hp is None else hp
    engine = cls(model_spec(algorithm, d, loss, data.classes, hp, data.x_norm, **fields), SeededNoise(seed))
    holds = cls.needs_retained_data or getattr(engine, "needs_retained_data", False)
    steps = np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    pos, sigmas, mechanisms = 0, [], set()
    out: dict[str, Any] = {}
    events = list(plan) + [(n, -1)]
    for j, (tau, u) in enumerate(events):
        while pos < tau:
            stop = min(pos + BATCH, tau)
            ret = _retained(steps[:pos], Xtr[:pos], ytr[:pos], alive[:pos]) if holds else None
            steps[pos:stop] = engine.learn(Xtr[pos:stop], ytr[pos:stop], ret)
            pos = stop
        if u < 0:
            break
        ret = _retained(steps[:pos], Xtr[:pos], ytr[:pos], alive[:pos]) if holds else None
        if getattr(engine, "needs_deletion_features", False):
            ret = ArrayRetained(steps[u:u + 1], Xtr[u:u + 1], ytr[u:u + 1])
        try:
            certs = engine.forget([int(steps[u])], ret)
        except (CapacityExhausted, ForgetError) as e:
            out["refused"] = f"refused after {j} forgets: {type(e).__name__}"
            return out
        sigmas += [float(c.sigma) for c in certs]
        mechanisms |= {str(c.mechanism) for c in certs}
        alive[u] = False
    out["end"] = _accuracy(engine, data.X_test, data.y_test)
    out["sigma_mean"] = float(np.mean(sigmas)) if sigmas else 0.0
    out["mechanisms"] = sorted(mechanisms)
    return out


# ---- references --------------------------------------------------------------------------------------------
def exact_retrain(data: Prepared, loss: str, keep: np.ndarray, **fields: float) -> float:
    """A fresh ``retrain``-family model (passive OGD, default schedule, no noise) learned on the kept records."""
    cls = ALGORITHMS["retrain"]
    spec = model_spec("retrain", data.X_train.shape[1], loss, data.classes, {}, data.x_norm, **fields)
    e = cls(spec)
    X, y = data.X_train[keep], data.y_train[keep]
    empty = ArrayRetained(np.zeros(0, np.int64), np.zeros((0, X.shape[1])), np.zeros(0))
    e.learn(X, y, empty)
    return _accuracy(e, data.X_test, data.y_test)


def river_single_pass(data: Prepared, keep: np.ndarray) -> float | None:
    try:
        from river import linear_model
    except ImportError:  # pragma: no cover - river is a bench extra
        return None
    # more than two classes: river's multinomial SoftmaxRegression (0.869 on digits; one-vs-rest over its
    # LogisticRegression reached 0.852 in the same setting: the stricter reference is kept)
    model = linear_model.LogisticRegression() if data.classes == 2 else linear_model.SoftmaxRegression()
    label = (lambda v: bool(v)) if data.classes == 2 else (lambda v: int(v))
    for x, y in zip(data.X_train[keep], data.y_train[keep]):
        model.learn_one(dict(enumerate(x)), label(y))
    pred = [model.predict_one(dict(enumerate(x))) for x in data.X_test]
    return float(np.mean([p == label(y) for p, y in zip(pred, data.y_test)]))


def batch_optimum(data: Prepared, keep: np.ndarray, l2: float) -> float | None:
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:  # pragma: no cover
        return None
    n = int(keep.sum())
    m = LogisticRegression(C=1.0 / (l2 * n), max_iter=5000).fit(data.X_train[keep], data.y_train[keep])
    return float(m.score(data.X_test, data.y_test))


# ---- the section -------------------------------------------------------------------------------------------
COLUMNS = ("before",) + tuple(f"{w} {m}" for w in ("end", "during") for m in MILESTONES[1:])
SEED_BUDGET_S = 60.0   # a family gets further noise seeds only while its runs so far took less than this
SWEEP_L2 = (0.01, 0.1, 1.0)
# non-default settings shown beside the defaults: the setting a default replaced, and the capacity-bounded
# passive allocation (a user who knows the number of deletions in advance)
EXTRA_ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "active_olu single": ("active_olu", {"variant": "single"}),
    "passive_olu uniform": ("passive_olu", {"allocation": "uniform"}),
}


def _summary(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "min": float(np.min(values)), "max": float(np.max(values)),
            "median": float(np.median(values)), "n": len(values)}


def _references(data: Prepared, loss: str, keep: np.ndarray, **fields: float) -> dict[str, float | None]:
    return {"exact retrain": exact_retrain(data, loss, keep, **fields),
            "river single pass": river_single_pass(data, keep),
            "batch optimum (sklearn)": batch_optimum(data, keep, fields.get("l2", MODEL_DEFAULTS["l2"]))}


def run_dataset(entry: Entry, quick: bool, families: list[str] | None = None, seeds: int | None = None,
                **fields: float) -> dict[str, Any]:
    """Every family on one data set: scenario "end" (the stream, then 1 % and cumulatively 10 % of it forgotten)
    and scenario "during" (the same numbers of forget requests spread through the stream, ``during_plan``)."""
    data = entry.load(quick)
    n = len(data.y_train)
    n_marks = marks(n)
    forget_order = np.random.default_rng(FORGET_SEED).permutation(n)[: n_marks[-1]]
    plans = {f"during {m}": during_plan(n, k) for m, k in zip(MILESTONES[1:], n_marks)}
    seeds = seeds if seeds is not None else (2 if quick else SEEDS)
    res: dict[str, Any] = {"what": entry.what, "loss": entry.loss, "features": entry.features,
                           "n_train": n, "n_test": len(data.y_test), "dim": data.X_train.shape[1],
                           "classes": data.classes, "forgets": dict(zip(MILESTONES[1:], n_marks)),
                           "seeds": seeds, "spec_fields": {**MODEL_DEFAULTS, **fields}, "references": {},
                           "families": {}}
    keeps = {"before": np.ones(n, bool)}
    for mark, label in zip(n_marks, MILESTONES[1:]):
        k = np.ones(n, bool)
        k[forget_order[:mark]] = False
        keeps[f"end {label}"] = k
    for col, plan in plans.items():
        k = np.ones(n, bool)
        k[[u for _, u in plan]] = False
        keeps[col] = k
    refs = {col: _references(data, entry.loss, keeps[col], **fields) for col in COLUMNS}
    res["references"] = {name: {col: refs[col][name] for col in COLUMNS} for name in refs["before"]}
    rows = [(a, a, None) for a in ALGORITHMS] + [(label, a, hp) for label, (a, hp) in EXTRA_ROWS.items()]
    for label, algorithm, extra in rows:
        if families is not None and algorithm not in families:
            continue
        hp = None if extra is None else _with_declared(extra, algorithm, n, n_marks[-1])
        cols: dict[str, list[float]] = {c: [] for c in COLUMNS}
        sig: list[float] = []
        refused: list[str] = []
        mech: set[str] = set()
        t0 = time.perf_counter()
        try:
            for seed in range(1 if algorithm == "retrain" else seeds):
                if seed and time.perf_counter() - t0 > SEED_BUDGET_S:
                    break
                r = run_family(algorithm, data, entry.loss, forget_order, seed, hp, **fields)
                for m in MILESTONES:
                    if m in r:
                        cols["before" if m == "before" else f"end {m}"].append(r[m])
                refused += [f"end: {r['refused']}"] if "refused" in r else []
                sig.append(r["sigma_mean"])
                mech |= set(r["mechanisms"])
                for col, plan in plans.items():
                    r = run_during(algorithm, data, entry.loss, plan, seed,
                                   None if extra is None else _with_declared(extra, algorithm, n, len(plan)), **fields)
                    if "end" in r:
                        cols[col].append(r["end"])
                        mech |= set(r["mechanisms"])
                    else:
                        refused.append(f"{col}: {r['refused']}")
        except SpecError as e:
            res["families"][label] = {"skipped": f"refused at creation: {e}"}
            continue
        row: dict[str, Any] = {c: _summary(v) for c, v in cols.items() if v}
        row.update(seconds=time.perf_counter() - t0, sigma_mean=float(np.mean(sig)) if sig else 0.0,
                   mechanisms=sorted(mech), hyperparameters=hp or declared(algorithm, n, n_marks[-1]))
        if refused:
            row["refused"] = sorted(set(refused))
        res["families"][label] = row
    return res


def _with_declared(extra: dict[str, Any], algorithm: str, n: int, k: int) -> dict[str, Any]:
    """``extra`` over the declared hyperparameters; a capacity-bounded allocation gets max_deletions = k."""
    hp = {**declared(algorithm, n, k), **extra}
    if hp.get("allocation") == "uniform":
        hp["max_deletions"] = max(1, k)
    return hp


def l2_sweep(entry: Entry, quick: bool, seeds: int) -> list[dict[str, Any]]:
    """passive_olu at larger l2 with the smallest radius that holds every logistic minimiser, R = sqrt(2 log 2 /
    l2) (f(theta*) <= f(0) = log 2, so (l2/2)||theta*||^2 <= log 2): does a stronger regulariser, whose noise
    scale L/(l2 t) is smaller, keep more accuracy after forgetting?  (It does not: the signal shrinks with it.)"""
    data = entry.load(quick)
    n = len(data.y_train)
    n_marks = marks(n)
    forget_order = np.random.default_rng(FORGET_SEED).permutation(n)[: n_marks[-1]]
    rows = []
    for l2 in SWEEP_L2:
        R = math.sqrt(2.0 * math.log(2.0) / l2)
        runs = [run_family("passive_olu", data, entry.loss, forget_order, s, l2=l2, domain_radius=R)
                for s in range(seeds)]
        rows.append({"l2": l2, "domain_radius": R,
                     "exact retrain": exact_retrain(data, entry.loss, np.ones(n, bool), l2=l2, domain_radius=R),
                     **{c: _summary([r[m] for r in runs if m in r]) for c, m in
                        (("before", "before"), ("end 1%", "1%"), ("end 10%", "10%"))}})
    return rows


def run(quick: bool, datasets: list[str] | None = None, families: list[str] | None = None,
        seeds: int | None = None, sweep: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"epsilon": EPSILON, "delta": DELTA, "rho": RHO, "fractions": list(FRACTIONS),
                           "batch": BATCH, "datasets": {}, "skipped": {}}
    for entry in DATASETS:
        if datasets is not None and entry.name not in datasets:
            continue
        why = unsupported(entry)
        if why is not None:
            out["skipped"][entry.name] = why
            continue
        out["datasets"][entry.name] = run_dataset(entry, quick, families, seeds)
    if sweep and "breast-cancer" in out["datasets"]:
        entry = next(e for e in DATASETS if e.name == "breast-cancer")
        out["l2_sweep"] = {"dataset": entry.name, "rows": l2_sweep(entry, quick, seeds or (2 if quick else SEEDS))}
    out["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())  # the docs say when, also when re-rendered
    return out


def _cell(v: dict[str, float] | float | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, dict):
        return f"{v['mean']:.3f}" + (f" ({v['min']:.2f}-{v['max']:.2f})" if v["n"] > 1 and v["max"] > v["min"] else "")
    return f"{v:.3f}"


def table(r: dict[str, Any]) -> list[str]:
    lines = [f"## accuracy: held-out accuracy before / after forgetting (epsilon = {r['epsilon']:g}, "
             f"delta = {r['delta']:g}); mean (min-max) over noise seeds",
             "   end X% = X% of the stream forgotten after it; during X% = as many forget requests spread through it"]
    for name, why in r["skipped"].items():
        lines.append(f"skipped {name}: {why}")
    for name, d in r["datasets"].items():
        forgets = ", ".join(f"{k} = {v} records" for k, v in d["forgets"].items())
        lines += ["", f"### {name}: {d['what']}; {d['n_train']} train / {d['n_test']} test, d = {d['dim']}, "
                      f"{forgets}; R = {d['spec_fields']['domain_radius']:g}, l2 = {d['spec_fields']['l2']:g}, "
                      f"up to {d['seeds']} seeds",
                  f"{'model':>24} " + " ".join(f"{m:>17}" for m in COLUMNS) + f" {'sigma':>8} {'time':>7}"]
        for ref, v in d["references"].items():
            lines.append(f"{ref:>24} " + " ".join(f"{_cell(v[m]):>17}" for m in COLUMNS))
        for fam, v in d["families"].items():
            if "skipped" in v:
                lines.append(f"{fam:>24} {v['skipped']}")
                continue
            cells = " ".join(f"{_cell(v.get(m)):>17}" for m in COLUMNS)
            lines.append(f"{fam:>24} {cells} {v['sigma_mean']:>8.3g} {v['seconds']:>6.1f}s")
            for why in v.get("refused", []):
                lines.append(f"{'':>24}   {why}")
    if "l2_sweep" in r:
        lines += ["", f"### passive_olu on {r['l2_sweep']['dataset']} with a larger l2 and R = sqrt(2 log 2 / l2)",
                  f"{'l2':>6} {'R':>6} {'exact retrain':>14} " + " ".join(f"{c:>17}" for c in ("before", "end 1%", "end 10%"))]
        for row in r["l2_sweep"]["rows"]:
            lines.append(f"{row['l2']:>6g} {row['domain_radius']:>6.2f} {row['exact retrain']:>14.3f} "
                         + " ".join(f"{_cell(row[c]):>17}" for c in ("before", "end 1%", "end 10%")))
    return lines


def targets(r: dict[str, Any], recommended: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """The section's two targets per data set: before forgetting within 2 points of river's single pass (the
    default family, passive_olu), and after forgetting the recommended family of each situation and regime
    within 2 points of the exact retrain."""
    out = []
    for name, d in r["datasets"].items():
        river = d["references"]["river single pass"]["before"]
        fam = d["families"].get("passive_olu", {})
        if river is not None and "before" in fam:
            v = fam["before"]["mean"]
            out.append({"dataset": name, "target": "passive_olu before forgetting >= river single pass - 0.02",
                        "measured": v, "reference": river, "met": v >= river - 0.02})
        for situation, regimes in recommended.items():
            for col, algorithm in regimes.items():
                fam = d["families"].get(algorithm, {})
                ref = d["references"]["exact retrain"][col]
                v = fam[col]["mean"] if col in fam else None
                out.append({"dataset": name, "target": f"{situation}, {col}: {algorithm} >= exact retrain - 0.02",
                            "measured": v, "reference": ref, "met": None if v is None else v >= ref - 0.02})
    return out


