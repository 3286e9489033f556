"""Section ``scale_accuracy``: held-out accuracy and cost per forget at production scale and realistic deletion
rates, every family beside the exact retrain, and membership inference after forgetting
(``python -m bench --sections scale_accuracy``; docs/accuracy.md, "Accuracy at scale" and "Membership inference
after forgetting"; issue 25 items 2 and 3).

Protocol (bench/accuracy.py's, at scale; its helpers are reused: ``declared``, ``model_spec``, ``during_plan``,
SeededNoise, epsilon = 1, delta = 1e-6, ``MODEL_DEFAULTS``):

* Data.  No public data set of 1e5 records or more ships inside an installed package (scikit-learn's bundled
  sets have at most 1 797 rows; nothing larger is bundled by the installed packages), so the main stream is
  synthetic and documented: ``synthetic_stream`` -- d = 32, rows uniform on the unit sphere (x_norm = 1), the
  label 1[<w, x> > 0] for a fixed unit vector w, flipped with probability 0.05 (Bayes accuracy 0.95), seeded;
  N_TRAIN = 1e5 records in the stream, N_TEST = 2e4 held out.  Beside it the largest real data set of
  bench.accuracy (``digits``, 1 438 records in the stream, softmax over 10 classes).  1e6 records are left out on
  this machine (two shared cores): the families that replay in Python would take hours.
* Every family of ``app.unlearning.ALGORITHMS`` (a new family appears by itself), one noise seed, its default
  hyperparameters except what must be declared (``declared``: the true stream length and number of forgets).
  Learn requests of SCALE_BATCH records.
* Deletion rates RATES = 1e-4, 1e-3, 1e-2 of the stream (k = max(1, round(rate n)) records).  "end": after the
  stream, cumulatively 1e-4, then 1e-3, then 1e-2 forgotten, one record per request, drawn at random (fixed
  seed); accuracy at each.  "during": k forget requests spread evenly through the stream, each for a random record
  learned so far (``bench.accuracy.during_plan``); accuracy at the end.  One run per rate.
* Reference: the exact retrain, a fresh noise-free ``retrain``-family model (passive OGD) on the remaining records
  with the clock of the full stream kept (forgotten steps skipped): exactly what the ``retrain`` family publishes
  after those forgets.
* Cost per forget: wall time of ``engine.forget`` alone (the retained-store bookkeeping is not counted), median
  over the forgets timed, and x the retrain family's median at the same n.
* Budgets.  A family's forgets after the stream stop after END_BUDGET_S seconds; a "during" run is not started
  when its projected time (learn + k forgets at the median cost) is above DURING_BUDGET_S.  For a family whose
  forgets are *exact equivalents* -- after its timed forgets it publishes the same scores (within 1e-9) as a fresh
  model of the same family learned on the masked stream (``masked_model``), checked here, not assumed -- the
  cells it did not reach are computed by that one pass and marked "=" in the tables.  Other cells not reached are
  "-" with the number of forgets done.
* Membership inference (bench/membership.py) at the 1e-2 rate, end and during: the loss-threshold attack and
  offline LiRA (N_SHADOW shadow models: noise-free ``retrain``-family models on random halves of the stream's
  non-target records).  AUC of the forgotten records vs never-seen (held-out) records, and of a sample of retained
  records vs the same never-seen records, with a bootstrap 95 % interval.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np

from app.unlearning import ALGORITHMS, CapacityExhausted, ForgetError, SeededNoise, SpecError
from app.unlearning.families.sisa import DEFAULT_SLICES

from . import membership as M
from .accuracy import (DATASETS, DELTA, EPSILON, FORGET_SEED, MODEL_DEFAULTS, RHO, Prepared, declared, during_plan,
                       model_spec, unit_rows)

RATES = (1e-4, 1e-3, 1e-2)
MIA_RATE = 1e-2
DIM, LABEL_FLIP = 32, 0.05
N_TRAIN, N_TEST = 100_000, 20_000
QUICK_TRAIN, QUICK_TEST = 3_000, 1_000
SCALE_BATCH = 1000
END_BUDGET_S, DURING_BUDGET_S = 60.0, 90.0
LEARN_BUDGET_S = 300.0   # a family whose learning of the stream alone takes longer is stopped there (reported)
QUICK_BUDGET_S = 5.0
SWEEP_BUDGET_S = 8.0
N_SHADOW = 8
RETAINED_SAMPLE = 2000
SISA_SHARDS, SISA_SLICES = (1, 4, 8, 16, 32), (1, 4, 16)


def rate_label(rate: float) -> str:
    return f"{rate:.0e}".replace("e-0", "e-")


def k_of(rate: float, n: int) -> int:
    return max(1, round(rate * n))


def hyperparameters(algorithm: str, n: int, k: int) -> dict[str, Any]:
    """``bench.accuracy.declared`` plus the retained-record cap ``max_records`` = n for a family that keeps the
    records (the service always sets it, from its work budget when the user does not; ``sisa`` cuts its shards
    into slices of max_records / (S R) records)."""
    hp = declared(algorithm, n, k)
    if ALGORITHMS[algorithm].needs_retained_data:
        hp["max_records"] = n
    return hp


class OverBudget(Exception):
    pass


# ---- data --------------------------------------------------------------------------------------------------
def synthetic_stream(n_train: int, n_test: int, dim: int = DIM, flip: float = LABEL_FLIP, seed: int = 0) -> Prepared:
    """Rows uniform on the unit sphere, label 1[<w, x> > 0] for a fixed unit w, flipped with probability ``flip``
    (the Bayes classifier's accuracy is 1 - flip); train and test from the same seeded draw."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    X = unit_rows(rng.standard_normal((n, dim)))
    w = unit_rows(rng.standard_normal((1, dim)))[0]
    y = (X @ w > 0).astype(np.float64)
    y = np.where(rng.random(n) < flip, 1.0 - y, y)
    return Prepared(X[:n_train], y[:n_train], X[n_train:], y[n_train:], 2)


def datasets(quick: bool) -> list[dict[str, Any]]:
    n, m = (QUICK_TRAIN, QUICK_TEST) if quick else (N_TRAIN, N_TEST)
    out = [{"name": f"synthetic {n}", "loss": "logistic", "data": synthetic_stream(n, m),
            "what": f"synthetic: d = {DIM}, rows uniform on the unit sphere, label 1[<w,x> > 0] flipped with "
                    f"probability {LABEL_FLIP:g} (Bayes accuracy {1 - LABEL_FLIP:g}); {n} in the stream, {m} held out"}]
    if not quick:
        entry = next(e for e in DATASETS if e.name == "digits")
        out.append({"name": "digits", "loss": entry.loss, "data": entry.load(False),
                    "what": entry.what + " (the largest real data set bundled with an installed package)"})
    return out


# ---- the retained store, without copies --------------------------------------------------------------------
class MaskedRetained:
    """``RetainedData`` over the stream's arrays: the records in [0, upto) still alive, in step order (steps are
    increasing along the stream).  Nothing is copied at construction (ArrayRetained sorts and copies n x d per
    request: at 1e5 records that is most of a cheap forget's wall time)."""

    def __init__(self, steps: np.ndarray, X: np.ndarray, y: np.ndarray, alive: np.ndarray, upto: int):
        self.steps, self.X, self.y, self.alive, self.upto = steps, X, y, alive, upto

    def __len__(self) -> int:
        return int(self.alive[: self.upto].sum())

    def get(self, steps):
        steps = np.asarray(steps, dtype=np.int64)
        idx = np.searchsorted(self.steps[: self.upto], steps)
        if len(idx) and (idx.max() >= self.upto or not np.array_equal(self.steps[idx], steps)
                         or not self.alive[idx].all()):
            raise KeyError("some steps are not retained")
        return self.X[idx], self.y[idx]

    def chunks(self, size: int, exclude=()):
        keep = self.alive[: self.upto].copy()
        if len(exclude):
            ex = np.searchsorted(self.steps[: self.upto], np.fromiter(exclude, dtype=np.int64, count=len(exclude)))
            keep[ex[ex < self.upto]] = False
        idx = np.flatnonzero(keep)
        for s in range(0, len(idx), size):
            j = idx[s: s + size]
            yield self.steps[j], self.X[j], self.y[j]


# ---- one family, one scenario ------------------------------------------------------------------------------
class Run:
    """A family's model driven through a stream: learn requests, forgets (timed), the retained store."""

    def __init__(self, algorithm: str, data: Prepared, loss: str, hp: dict[str, Any], seed: int = 0, noise=True):
        cls = ALGORITHMS[algorithm]
        self.data, self.n = data, len(data.y_train)
        self.engine = cls(model_spec(algorithm, data.X_train.shape[1], loss, data.classes, hp, data.x_norm),
                          SeededNoise(seed))
        self.holds = cls.needs_retained_data or getattr(self.engine, "needs_retained_data", False)
        self.client = getattr(self.engine, "needs_deletion_features", False)
        self.steps = np.zeros(self.n, dtype=np.int64)
        self.alive = np.ones(self.n, dtype=bool)
        self.pos = 0
        self.forget_s: list[float] = []
        self.sigmas: list[float] = []
        self.mechanisms: set[str] = set()

    def store(self, upto: int):
        return MaskedRetained(self.steps, self.data.X_train, self.data.y_train, self.alive, upto) if self.holds else None

    def learn_to(self, stop: int, skip: np.ndarray | None = None, deadline: float | None = None) -> None:
        """Learn records [pos, stop) in requests of SCALE_BATCH; records with ``skip`` set are not sent (the
        masked stream: the clock advances over them where the family can skip, ``masked_model``).  OverBudget
        once ``deadline`` (perf_counter) is passed."""
        X, y = self.data.X_train, self.data.y_train
        while self.pos < stop:
            if deadline is not None and time.perf_counter() > deadline:
                raise OverBudget(f"learning stopped after {self.pos} of {stop} records (over "
                                 f"{LEARN_BUDGET_S:.0f} s)")
            end = min(self.pos + SCALE_BATCH, stop)
            if skip is None:
                self.steps[self.pos:end] = self.engine.learn(X[self.pos:end], y[self.pos:end], self.store(self.pos))
            else:
                idx = np.arange(self.pos, end)
                for run in np.split(idx, np.flatnonzero(np.diff(skip[idx].astype(np.int8))) + 1):
                    if skip[run[0]]:
                        # skipped records get the steps they would have had (or the last one: the store's step
                        # order stays monotone), and are dead
                        t = int(self.engine.step)
                        if hasattr(self.engine, "skip"):
                            self.engine.skip(len(run))
                            self.steps[run] = np.arange(t + 1, t + 1 + len(run))
                            self.alive[run] = False
                        else:  # no skip symbol: learn each record and forget it at once (its clock is kept)
                            for u in run:
                                self.steps[u] = self.engine.learn(X[u:u + 1], y[u:u + 1], self.store(int(u)))[0]
                                self.engine.forget([int(self.steps[u])], self.forget_store(int(u), int(u) + 1))
                                self.alive[u] = False
                    else:
                        self.steps[run] = self.engine.learn(X[run], y[run], self.store(int(run[0])))
            self.pos = end

    def forget_store(self, u: int, upto: int):
        """What a forget of record u reads: the retained store, or the record resent by the client."""
        if self.client:
            return MaskedRetained(self.steps[u:u + 1], self.data.X_train[u:u + 1], self.data.y_train[u:u + 1],
                                  np.ones(1, bool), 1)
        return self.store(upto)

    def forget(self, u: int) -> None:
        ret = self.forget_store(u, self.pos)
        t0 = time.perf_counter()
        certs = self.engine.forget([int(self.steps[u])], ret)
        self.forget_s.append(time.perf_counter() - t0)
        self.sigmas += [float(c.sigma) for c in certs]
        self.mechanisms |= {str(c.mechanism) for c in certs}
        self.alive[u] = False

    def accuracy(self) -> float:
        return float(np.mean(self.engine.predict(self.data.X_test)[0] == self.data.y_test))


def masked_model(algorithm: str, data: Prepared, loss: str, hp: dict[str, Any], keep: np.ndarray) -> Run:
    """A fresh model of the family learned on the masked stream (records not in ``keep`` skipped, the clock kept
    where the family can skip): for ``retrain`` the exact reference; for another family, what its forgets must
    equal if they are exact -- ``run_end`` checks it before using it."""
    r = Run(algorithm, data, loss, hp)
    r.learn_to(len(keep), skip=~keep)
    return r


def _scores(run: Run, X: np.ndarray) -> np.ndarray:
    return np.asarray(run.engine.predict(X)[1], dtype=np.float64)


def equivalent(run: Run, algorithm: str, data: Prepared, loss: str, hp: dict[str, Any]) -> bool:
    """Whether ``run`` (after its forgets) publishes what a fresh model on the masked stream publishes."""
    if not run.forget_s or any(s != 0.0 for s in run.sigmas):
        return False
    ref = masked_model(algorithm, data, loss, hp, run.alive.copy())
    return bool(np.max(np.abs(_scores(run, data.X_test) - _scores(ref, data.X_test))) <= 1e-9)


class Targets:
    """The records membership inference is run on: the held-out records (never seen), the end-of-stream and
    during-stream forgotten records at MIA_RATE, a sample of records retained by both; LiRA's OUT Gaussians
    fitted on shadow models trained on the rest of the stream."""

    def __init__(self, data: Prepared, loss: str, forgot_end: np.ndarray, forgot_during: np.ndarray, quick: bool):
        n = len(data.y_train)
        rng = np.random.default_rng(FORGET_SEED + 1)
        others = np.setdiff1d(np.arange(n), np.concatenate([forgot_end, forgot_during]))
        self.retained = np.sort(rng.choice(others, min(RETAINED_SAMPLE, len(others) // 4), replace=False))
        self.forgot_end, self.forgot_during = forgot_end, forgot_during
        pool = np.setdiff1d(others, self.retained)
        self.X = np.concatenate([data.X_test, data.X_train[forgot_end], data.X_train[forgot_during],
                                 data.X_train[self.retained]])
        self.y = np.concatenate([data.y_test, data.y_train[forgot_end], data.y_train[forgot_during],
                                 data.y_train[self.retained]])
        a = len(data.y_test)
        b = a + len(forgot_end)
        c = b + len(forgot_during)
        self.slices = {"never seen": slice(0, a), "forgotten end": slice(a, b), "forgotten during": slice(b, c),
                       "retained": slice(c, len(self.y))}
        self.pos_end = {int(u): a + i for i, u in enumerate(forgot_end)}
        self.pos_during = {int(u): b + i for i, u in enumerate(forgot_during)}

        def train(X, y):
            sub = Prepared(X, y, data.X_test[:1], data.y_test[:1], data.classes, data.x_norm)
            r = Run("retrain", sub, loss, {})
            r.learn_to(len(y))
            return r.engine

        self.n_shadow = 2 if quick else N_SHADOW
        self.out = M.Shadows(train, data.X_train[pool], data.y_train[pool], self.n_shadow).fit(self.X, self.y)

    def aucs(self, run: Run, scenario: str, forgotten: np.ndarray) -> dict[str, Any]:
        """AUCs (with intervals) of forgotten vs never-seen and retained vs never-seen, for both attacks."""
        s = M.attack_scores(_scores(run, self.X), self.y, self.out)
        where = self.pos_end if scenario == "end" else self.pos_during
        fi = np.array([where[int(u)] for u in forgotten], dtype=np.int64)
        res: dict[str, Any] = {"n_forgotten": len(fi)}
        for attack, v in s.items():
            never = v[self.slices["never seen"]]
            res[attack] = {"forgotten": M.auc_ci(v[fi], never, seed=1),
                           "retained": M.auc_ci(v[self.slices["retained"]], never, seed=2)}
        return res


def run_end(algorithm: str, d: dict[str, Any], hp: dict[str, Any], order: np.ndarray, ks: list[int],
            budget: float, targets: Targets | None, learn_budget: float = LEARN_BUDGET_S) -> dict[str, Any]:
    data, loss = d["data"], d["loss"]
    r = Run(algorithm, data, loss, hp)
    t0 = time.perf_counter()
    r.learn_to(r.n, deadline=t0 + learn_budget)
    out: dict[str, Any] = {"learn_s": time.perf_counter() - t0, "before": r.accuracy(), "reached": {}}
    t0 = time.perf_counter()
    done = 0
    try:
        for rate, k in zip(RATES, ks):
            while done < k and time.perf_counter() - t0 < budget:
                r.forget(int(order[done]))
                done += 1
            if done < k:
                break
            out[f"end {rate_label(rate)}"] = r.accuracy()
            out["reached"][f"end {rate_label(rate)}"] = "run"
    except (CapacityExhausted, ForgetError) as e:
        out["refused"] = f"end: refused after {done} forgets ({type(e).__name__})"
    out.update(done=done, forget_us=[s * 1e6 for s in r.forget_s], sigma_mean=float(np.mean(r.sigmas)) if r.sigmas
               else 0.0, mechanisms=sorted(r.mechanisms))
    # whether the forgets are exact equivalents is checked only where it is needed: the run stopped short
    out["exact_equivalent"] = (None if done >= ks[-1] else
                               "refused" not in out and equivalent(r, algorithm, data, loss, hp))
    mia_k = ks[RATES.index(MIA_RATE)] if len(ks) > RATES.index(MIA_RATE) else None
    if targets is not None and done >= 1:
        if done >= mia_k or not out["exact_equivalent"]:
            out["mia"] = targets.aucs(r, "end", order[:min(done, mia_k)])
            out["mia"]["how"] = "run" if done >= mia_k else f"run, {done} forgets"
    if out["exact_equivalent"]:  # the cells not reached: one pass of the same family on the masked stream
        for rate, k in zip(RATES, ks):
            col = f"end {rate_label(rate)}"
            if col not in out:
                keep = np.ones(r.n, bool)
                keep[order[:k]] = False
                eq = masked_model(algorithm, data, loss, hp, keep)
                out[col], out["reached"][col] = eq.accuracy(), "equivalent"
                if k == mia_k and targets is not None:
                    out["mia"] = targets.aucs(eq, "end", order[:k])
                    out["mia"]["how"] = "equivalent"
    return out


def equivalent_after_end(algorithm: str, d: dict[str, Any], hp: dict[str, Any], order: np.ndarray,
                         row: dict[str, Any], timed: int = 3) -> bool:
    """The exact-equivalence check for a family whose end run completed (so it was not checked): a few forgets
    after the stream, then the comparison with the masked stream (``equivalent``)."""
    if "refused" in row:
        return False
    r = Run(algorithm, d["data"], d["loss"], hp)
    r.learn_to(r.n)
    for u in order[:timed]:
        r.forget(int(u))
    return equivalent(r, algorithm, d["data"], d["loss"], hp)


def run_during(algorithm: str, d: dict[str, Any], hp: dict[str, Any], plan: list[tuple[int, int]],
               targets: Targets | None) -> dict[str, Any]:
    data, loss = d["data"], d["loss"]
    r = Run(algorithm, data, loss, hp)
    out: dict[str, Any] = {}
    for j, (tau, u) in enumerate(plan + [(r.n, -1)]):
        r.learn_to(tau)
        if u < 0:
            break
        try:
            r.forget(u)
        except (CapacityExhausted, ForgetError) as e:
            return {"refused": f"during: refused after {j} forgets ({type(e).__name__})"}
    out["acc"] = r.accuracy()
    if targets is not None:
        out["mia"] = targets.aucs(r, "during", np.array([u for _, u in plan]))
        out["mia"]["how"] = "run"
    return out


# ---- the section -------------------------------------------------------------------------------------------
def exact_reference(d: dict[str, Any], keep: np.ndarray) -> float:
    return masked_model("retrain", d["data"], d["loss"], {}, keep).accuracy()


def run_dataset(d: dict[str, Any], quick: bool, families: list[str] | None = None,
                log=print, objects: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every family (or ``families``) on one stream; ``objects``, if given, receives the forget order, the
    during plans and the membership targets (tests)."""
    data = d["data"]
    n = len(data.y_train)
    ks = [k_of(rate, n) for rate in RATES]
    order = np.random.default_rng(FORGET_SEED).permutation(n)[: ks[-1]]
    plans = {rate: during_plan(n, k) for rate, k in zip(RATES, ks)}
    end_budget = QUICK_BUDGET_S if quick else END_BUDGET_S
    during_budget = QUICK_BUDGET_S if quick else DURING_BUDGET_S
    res: dict[str, Any] = {"what": d["what"], "n_train": n, "n_test": len(data.y_test), "dim": data.X_train.shape[1],
                           "loss": d["loss"], "ks": {rate_label(r): k for r, k in zip(RATES, ks)},
                           "batch": SCALE_BATCH, "budgets_s": [end_budget, during_budget], "families": {}}
    t0 = time.perf_counter()
    keeps = {"before": np.ones(n, bool)}
    for rate, k in zip(RATES, ks):
        keep = np.ones(n, bool)
        keep[order[:k]] = False
        keeps[f"end {rate_label(rate)}"] = keep
        keep = np.ones(n, bool)
        keep[[u for _, u in plans[rate]]] = False
        keeps[f"during {rate_label(rate)}"] = keep
    res["reference"] = {col: exact_reference(d, keep) for col, keep in keeps.items()}
    log(f"    {d['name']}: exact retrain references in {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    targets = Targets(data, d["loss"], order[: ks[RATES.index(MIA_RATE)]],
                      np.array([u for _, u in plans[MIA_RATE]], dtype=np.int64), quick)
    log(f"    {d['name']}: {targets.n_shadow} shadow models in {time.perf_counter() - t0:.1f}s")
    if objects is not None:
        objects.update(order=order, plans=plans, targets=targets, keeps=keeps)
    for algorithm in ALGORITHMS:
        if families is not None and algorithm not in families:
            continue
        t0 = time.perf_counter()
        try:
            hp_end = hyperparameters(algorithm, n, ks[-1])
            row = run_end(algorithm, d, hp_end, order, ks, end_budget, targets,
                          QUICK_BUDGET_S * 4 if quick else LEARN_BUDGET_S)
        except SpecError as e:
            res["families"][algorithm] = {"skipped": f"refused at creation: {e}"}
            log(f"    {algorithm}: skipped ({e})")
            continue
        except OverBudget as e:
            res["families"][algorithm] = {"skipped": str(e)}
            log(f"    {algorithm}: {e}")
            continue
        med = float(np.median(row["forget_us"])) if row["forget_us"] else None
        row["forget_us_median"] = med
        for rate, k in zip(RATES, ks):
            col = f"during {rate_label(rate)}"
            hp = hyperparameters(algorithm, n, k)
            projected = row["learn_s"] + k * (med or 0.0) * 1e-6
            if "refused" in row and not row["forget_us"]:
                continue
            if projected > during_budget and row["learn_s"] > during_budget / 2:
                row.setdefault("notes", []).append(f"{col}: not run, learning alone took {row['learn_s']:.0f} s")
                continue
            if projected > during_budget and row["exact_equivalent"] is None:
                row["exact_equivalent"] = equivalent_after_end(algorithm, d, hp_end, order, row)
            if projected > during_budget and not row["exact_equivalent"]:
                row.setdefault("notes", []).append(f"{col}: not run, projected {projected:.0f} s")
                continue
            if projected <= during_budget:
                v = run_during(algorithm, d, hp, plans[rate], targets if rate == MIA_RATE else None)
                if "refused" in v:
                    row.setdefault("notes", []).append(v["refused"])
                    continue
                row[col], how = v["acc"], "run"
                if "mia" in v:
                    row["mia_during"] = v["mia"]
            else:
                eq = masked_model(algorithm, d["data"], d["loss"], hp, keeps[col])
                row[col], how = eq.accuracy(), "equivalent"
                if rate == MIA_RATE:
                    row["mia_during"] = targets.aucs(eq, "during", np.array([u for _, u in plans[rate]]))
                    row["mia_during"]["how"] = "equivalent"
            row["reached"][col] = how
        row["seconds"] = time.perf_counter() - t0
        res["families"][algorithm] = row
        log(f"    {algorithm}: {row['seconds']:.1f}s (learn {row['learn_s']:.1f}s, {row['done']} forgets timed, "
            f"median {med if med is None else round(med)} us, exact equivalent {row['exact_equivalent']})")
    base = res["families"].get("retrain", {}).get("forget_us_median")
    for row in res["families"].values():
        if row.get("forget_us_median") and base:
            row["x_retrain"] = row["forget_us_median"] / base
    return res


def sisa_sweep(d: dict[str, Any], quick: bool, log=print) -> list[dict[str, Any]] | None:
    """``sisa`` at shards S x slices R on the stream: accuracy before and at 1e-3 forgotten after the stream, and
    cost per forget (a few timed; the rest by the checked exact equivalent, ``run_end``)."""
    if "sisa" not in ALGORITHMS:
        return None
    n = len(d["data"].y_train)
    ks = [k_of(rate, n) for rate in RATES]
    order = np.random.default_rng(FORGET_SEED).permutation(n)[: ks[-1]]
    rows = []
    for S in SISA_SHARDS if not quick else (1, 4):
        for R in SISA_SLICES if not quick else (1, 4):
            t0 = time.perf_counter()
            hp = {**hyperparameters("sisa", n, ks[-1]), "shards": S, "slices": R}
            try:
                r = run_end("sisa", d, hp, order, ks[:2], 2.0 if quick else SWEEP_BUDGET_S, None)
            except (SpecError, OverBudget) as e:
                rows.append({"shards": S, "slices": R, "skipped": str(e)})
                continue
            rows.append({"shards": S, "slices": R, "before": r["before"], "end 1e-3": r.get("end 1e-3"),
                         "how": r["reached"].get("end 1e-3"), "forget_us_median":
                         float(np.median(r["forget_us"])) if r["forget_us"] else None, "timed": r["done"],
                         "learn_s": r["learn_s"]})
            log(f"    sisa S={S} R={R}: {time.perf_counter() - t0:.1f}s")
    return rows


def sisa_small_streams(quick: bool, log=print) -> list[dict[str, Any]] | None:
    """``sisa`` with S shards (R = its default) on bench.accuracy's real data sets, whose streams are small
    (455-3 200 records): held-out accuracy with every record learned, beside S = 1 (one model: the retrain
    family's OGD).  The other side of the sweep above: more shards cost nothing at 1e5 records, but each shard
    learns from n / S records only."""
    from .accuracy import _accuracy, unsupported

    if "sisa" not in ALGORITHMS:
        return None
    rows = []
    for entry in DATASETS[:1] if quick else DATASETS:
        if unsupported(entry) is not None:
            continue
        data = entry.load(quick)
        n = len(data.y_train)
        for S in (1, 8) if quick else SISA_SHARDS:
            hp = {**hyperparameters("sisa", n, 1), "shards": S}
            e = ALGORITHMS["sisa"](model_spec("sisa", data.X_train.shape[1], entry.loss, data.classes, hp,
                                              data.x_norm))
            e.learn(data.X_train, data.y_train)
            rows.append({"dataset": entry.name, "n": n, "shards": S, "per_shard": n // S,
                         "accuracy": _accuracy(e, data.X_test, data.y_test)})
        log(f"    sisa shards on {entry.name}: done")
    return rows


def run(quick: bool, families: list[str] | None = None, log=print) -> dict[str, Any]:
    out: dict[str, Any] = {"epsilon": EPSILON, "delta": DELTA, "rho": RHO, "rates": [rate_label(r) for r in RATES],
                           "spec_fields": dict(MODEL_DEFAULTS), "shadows": 2 if quick else N_SHADOW,
                           "datasets": {}, "quick": quick}
    t_all = time.perf_counter()
    for d in datasets(quick):
        log(f"  {d['name']} ...")
        out["datasets"][d["name"]] = run_dataset(d, quick, families, log)
        if d["loss"] == "logistic" and "sisa" in ALGORITHMS and (families is None or "sisa" in families):
            out["sisa_sweep"] = {"dataset": d["name"], "rows": sisa_sweep(d, quick, log)}
    if "sisa" in ALGORITHMS and (families is None or "sisa" in families):
        out["sisa_small"] = sisa_small_streams(quick, log)
    out["seconds"] = time.perf_counter() - t_all
    out["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out["targets"] = targets(out)
    return out


# ---- targets, tables, docs ---------------------------------------------------------------------------------
NO_DATA_CANDIDATES = None  # every family whose class keeps no data (needs_retained_data False)


def no_data_families() -> list[str]:
    return [a for a, cls in ALGORITHMS.items() if not cls.needs_retained_data]


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """At 1e-4 and 1e-3 (end and during), the best family that keeps no data within 2 points of the exact
    retrain; the recommended one (passive_olu) reported too."""
    out = []
    for name, d in r["datasets"].items():
        for rate in ("1e-4", "1e-3"):
            for when in ("end", "during"):
                col = f"{when} {rate}"
                ref = d["reference"][col]
                cands = {a: d["families"][a][col] for a in no_data_families()
                         if col in d["families"].get(a, {})}
                best = max(cands, key=cands.get) if cands else None
                for who, label in ((best, "best no-data family"), ("passive_olu", "passive_olu")):
                    v = cands.get(who) if who else None
                    out.append({"dataset": name, "column": col, "who": label, "family": who, "measured": v,
                                "reference": ref, "met": None if v is None else v >= ref - 0.02})
    return out


def _acc(row: dict[str, Any], col: str, ref: float | None = None) -> str:
    if col not in row:
        return "-"
    mark = "=" if row["reached"].get(col) == "equivalent" else ""
    gap = f" ({100 * (row[col] - ref):+.1f})" if ref is not None else ""
    return f"{mark}{row[col]:.3f}{gap}"


def _us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v < 1e5 else f"{v:.3g}"


def _ci(v: dict[str, Any] | None) -> str:
    if not v or math.isnan(v["auc"]):
        return "-"
    return f"{v['auc']:.3f} [{v['lo']:.2f}, {v['hi']:.2f}]"


def columns(d: dict[str, Any]) -> list[str]:
    return ["before"] + [f"{w} {rate}" for w in ("end", "during") for rate in d["ks"]]


def table(r: dict[str, Any]) -> list[str]:
    lines = [f"## scale_accuracy: held-out accuracy (gap to the exact retrain, points) and cost per forget, "
             f"epsilon = {r['epsilon']:g}, delta = {r['delta']:g}; '=' computed by the checked exact equivalent"]
    for name, d in r["datasets"].items():
        cols = columns(d)
        lines += ["", f"### {name}: {d['what']}; forgets {d['ks']}; learn requests of {d['batch']}",
                  f"{'model':>20} " + " ".join(f"{c:>16}" for c in cols) + f" {'us/forget':>10} {'x retrain':>9} "
                  f"{'timed':>5} {'sigma':>8}"]
        lines.append(f"{'exact retrain':>20} " + " ".join(f"{d['reference'][c]:>16.3f}" for c in cols))
        for fam, row in d["families"].items():
            if "skipped" in row:
                lines.append(f"{fam:>20} {row['skipped'][:150]}")
                continue
            cells = " ".join(f"{_acc(row, c, None if c == 'before' else d['reference'][c]):>16}" for c in cols)
            x = row.get("x_retrain")
            lines.append(f"{fam:>20} {cells} {_us(row['forget_us_median']):>10} "
                         f"{'-' if x is None else f'{x:.3g}':>9} {row['done']:>5} {row['sigma_mean']:>8.3g}")
            for note in ([row["refused"]] if "refused" in row else []) + row.get("notes", []):
                lines.append(f"{'':>20}   {note}")
        lines += ["", f"### {name}: membership inference at {rate_label(MIA_RATE)} (AUC [95% CI]; 0.5 = "
                      f"indistinguishable from never-seen records)",
                  f"{'model':>20} {'attack':>6} {'end: forgotten':>22} {'end: retained':>22} "
                  f"{'during: forgotten':>22} {'during: retained':>22}"]
        for fam, row in d["families"].items():
            for attack in ("loss", "lira"):
                e, w = row.get("mia", {}).get(attack, {}), row.get("mia_during", {}).get(attack, {})
                if not e and not w:
                    continue
                lines.append(f"{fam:>20} {attack:>6} {_ci(e.get('forgotten')):>22} {_ci(e.get('retained')):>22} "
                             f"{_ci(w.get('forgotten')):>22} {_ci(w.get('retained')):>22}")
    if r.get("sisa_sweep") and r["sisa_sweep"]["rows"]:
        lines += ["", f"### sisa: shards x slices on {r['sisa_sweep']['dataset']}",
                  f"{'S':>4} {'R':>4} {'before':>8} {'end 1e-3':>9} {'us/forget':>10} {'learn s':>8}"]
        widths = (4, 4, 8, 9, 10, 8)
        for cells in sweep_cells(r["sisa_sweep"]["rows"]):
            lines.append(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    lines.append("")
    for t in r.get("targets", []):
        mark = {True: "MET", False: "MISSED", None: "n/a"}[t["met"]]
        m = "-" if t["measured"] is None else f"{t['measured']:.3f}"
        lines.append(f"  [{mark:>6}] {t['dataset']}, {t['column']}: {t['who']} ({t['family']}) {m} vs exact retrain "
                     f"{t['reference']:.3f} - 0.02")
    return lines


SCALE_BEGIN = "<!-- generated by python -m bench --sections scale_accuracy (accuracy at scale): begin -->"
SCALE_END = "<!-- generated by python -m bench --sections scale_accuracy (accuracy at scale): end -->"
MIA_BEGIN = "<!-- generated by python -m bench --sections scale_accuracy (membership inference): begin -->"
MIA_END = "<!-- generated by python -m bench --sections scale_accuracy (membership inference): end -->"
COMMAND = "python -m bench --sections scale_accuracy"


def sweep_cells(rows: list[dict[str, Any]], pad: int = 0) -> list[list[str]]:
    """The sisa sweep's cells (S, R, before, end 1e-3, us/forget, learn s) for the printed and the docs table;
    a skipped configuration gives its reason (padded to ``pad`` cells for a markdown row)."""
    out = []
    for row in rows:
        if "skipped" in row:
            cells = [str(row["shards"]), str(row["slices"]), row["skipped"]]
            out.append(cells + [""] * max(0, pad - len(cells)))
            continue
        e = "-" if row["end 1e-3"] is None else ("=" if row["how"] == "equivalent" else "") + f"{row['end 1e-3']:.3f}"
        out.append([str(row["shards"]), str(row["slices"]), f"{row['before']:.3f}", e, _us(row["forget_us_median"]),
                    f"{row['learn_s']:.1f}"])
    return out


def markdown_scale(r: dict[str, Any]) -> list[str]:
    when = r.get("measured") or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"Measured {when} by `{COMMAND}` in {r['seconds'] / 60:.0f} "
             f"minutes; epsilon = {r['epsilon']:g}, delta = {r['delta']:g} (rho = {r['rho']:.4g}), domain_radius = "
             f"{r['spec_fields']['domain_radius']:g}, l2 = {r['spec_fields']['l2']:g}; one noise seed. Cells: held-out "
             "accuracy (gap to the exact retrain in points); **=** computed by the checked exact equivalent (the "
             "family's timed forgets published exactly what the same family learned on the masked stream publishes); "
             "µs/forget: median wall time of `forget` over the *timed* forgets; × retrain: against the `retrain` "
             "family's median at the same n. ![accuracy at scale](accuracy_scale.png)", ""]
    for name, d in r["datasets"].items():
        cols = columns(d)
        ks = ", ".join(f"{k} = {v}" for k, v in d["ks"].items())
        lines += [f"### {name}", "", f"{d['what']}; d = {d['dim']}; records forgotten per rate: {ks}; learn requests "
                                     f"of {d['batch']}; forget budget {d['budgets_s'][0]:g} s after the stream, "
                                     f"{d['budgets_s'][1]:g} s projected per run during it.", "",
                  "| model | " + " | ".join(cols) + " | µs/forget | × retrain | forgets timed | mean σ |",
                  "|---|" + "---|" * (len(cols) + 4)]
        lines.append("| *exact retrain* | " + " | ".join(f"{d['reference'][c]:.3f}" for c in cols) + " | | | | |")
        for fam, row in d["families"].items():
            if "skipped" in row:
                lines.append(f"| {fam} | {row['skipped']} |" + " |" * (len(cols) + 3))
                continue
            notes = ([row["refused"]] if "refused" in row else []) + row.get("notes", [])
            x = row.get("x_retrain")
            lines.append(f"| {fam}" + ("<br>" + "; ".join(notes) if notes else "") + " | "
                         + " | ".join(_acc(row, c, None if c == "before" else d["reference"][c]) for c in cols)
                         + f" | {_us(row['forget_us_median'])} | {'-' if x is None else f'{x:.3g}'} | {row['done']} | "
                           f"{row['sigma_mean']:.3g} |")
        lines.append("")
    if r.get("sisa_sweep") and r["sisa_sweep"]["rows"]:
        lines += [f"### SISA defaults: shards S × slices R ({r['sisa_sweep']['dataset']})", "",
                  "`sisa` with S shards and R slices per shard (max_records = n), no noise: held-out accuracy before "
                  "any forget and with 1e-3 of the stream forgotten after it, cost per forget (median over the timed "
                  "forgets) and the time to learn the stream.", "",
                  "| S | R | before | end 1e-3 | µs/forget | learn s |", "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in sweep_cells(r["sisa_sweep"]["rows"], 6)]
        lines.append("")
    if r.get("sisa_small"):
        lines += ["### SISA defaults: shards S on the small real streams", "",
                  f"`sisa` with S shards ({DEFAULT_SLICES} slices) learned on bench.accuracy's data sets: held-out "
                  "accuracy with every record learned (S = 1 is one model, the retrain family's OGD).", "",
                  "| data set | records | S | records per shard | accuracy | vs S = 1 |", "|---|---|---|---|---|---|"]
        one = {row["dataset"]: row["accuracy"] for row in r["sisa_small"] if row["shards"] == 1}
        for row in r["sisa_small"]:
            gap = 100 * (row["accuracy"] - one.get(row["dataset"], row["accuracy"]))
            lines.append(f"| {row['dataset']} | {row['n']} | {row['shards']} | {row['per_shard']} | "
                         f"{row['accuracy']:.3f} | {gap:+.1f} |")
        lines.append("")
    if r.get("targets"):
        lines += ["### Target: the no-data family within 2 points of the exact retrain at 1e-4 and 1e-3", ""]
        for t in r["targets"]:
            mark = {True: "met", False: "missed", None: "n/a"}[t["met"]]
            m = "-" if t["measured"] is None else f"{t['measured']:.3f}"
            lines.append(f"- {t['dataset']}, {t['column']}: {t['who']} (`{t['family']}`) {m} vs {t['reference']:.3f}: "
                         f"**{mark}**")
    return lines


def markdown_mia(r: dict[str, Any]) -> list[str]:
    lines = [f"Measured with the table above (`{COMMAND}`), at the {rate_label(MIA_RATE)} deletion rate. AUC [bootstrap "
             f"95 % interval] of the attack's membership score: forgotten records vs never-seen (held-out) records "
             f"(goal: 0.5), and a sample of retained records vs the same never-seen records (what the model still "
             f"remembers: the reference). Attacks: loss threshold (confidence on the true label) and offline LiRA "
             f"with {r['shadows']} shadow models (bench/membership.py). ![membership](membership.png)", ""]
    for name, d in r["datasets"].items():
        lines += [f"### {name} ({d['ks'][rate_label(MIA_RATE)]} records forgotten)", "",
                  "| model | attack | end: forgotten | end: retained | during: forgotten | during: retained | how |",
                  "|---|---|---|---|---|---|---|"]
        for fam, row in d["families"].items():
            for attack in ("loss", "lira"):
                e, w = row.get("mia", {}).get(attack, {}), row.get("mia_during", {}).get(attack, {})
                if not e and not w:
                    continue
                how = f"end: {row.get('mia', {}).get('how', '-')} (n = {row.get('mia', {}).get('n_forgotten', 0)}); " \
                      f"during: {row.get('mia_during', {}).get('how', '-')}"
                flag = ""
                for v in (e.get("forgotten"), w.get("forgotten")):
                    if v and not math.isnan(v["auc"]) and v["lo"] > 0.5:
                        flag = " **distinguishable**"
                lines.append(f"| {fam}{flag} | {attack} | {_ci(e.get('forgotten'))} | {_ci(e.get('retained'))} | "
                             f"{_ci(w.get('forgotten'))} | {_ci(w.get('retained'))} | {how} |")
        lines.append("")
    return lines


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    return plt


def _figure(r: dict[str, Any], columns: int, width: float, **kw):
    """(pyplot, figure, axes, data set names) with one row of ``columns`` axes per data set of the run, or None
    without matplotlib or without a data set."""
    plt = _pyplot()
    names = list(r["datasets"])
    if plt is None or not names:
        return None
    fig, axes = plt.subplots(len(names), columns, figsize=(width, 4.2 * len(names)), squeeze=False, **kw)
    return plt, fig, axes, names


def plot(r: dict[str, Any], path) -> bool:
    made = _figure(r, 1, 12)
    if made is None:
        return False
    plt, fig, axes, names = made
    series = (("mia", "forgotten", "end: forgotten"), ("mia_during", "forgotten", "during: forgotten"),
              ("mia", "retained", "end: retained"))
    for ax, name in zip(axes[:, 0], names):
        d = r["datasets"][name]
        fams = [f for f, v in d["families"].items() if "mia" in v or "mia_during" in v]
        w = 0.8 / (2 * len(series))
        k = 0
        for attack in ("loss", "lira"):
            for key, group, label in series:
                vals = [d["families"][f].get(key, {}).get(attack, {}).get(group) for f in fams]
                xs = [i + (k - (2 * len(series) - 1) / 2) * w for i in range(len(fams))]
                pts = [(x, v) for x, v in zip(xs, vals) if v and not math.isnan(v["auc"])]
                if pts:
                    ax.errorbar([p[0] for p in pts], [p[1]["auc"] for p in pts],
                                yerr=[[p[1]["auc"] - p[1]["lo"] for p in pts], [p[1]["hi"] - p[1]["auc"] for p in pts]],
                                fmt="o" if attack == "loss" else "s", ms=4, capsize=2, label=f"{attack}, {label}",
                                color=f"C{k}")
                k += 1
        ax.axhline(0.5, color="k", lw=1, ls="--")
        ax.set_xticks(range(len(fams)), fams, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("membership AUC vs never-seen")
        ax.set_title(f"{name}: membership inference after forgetting {rate_label(MIA_RATE)} of the stream "
                     f"(95 % bootstrap intervals)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, ncol=3, loc="upper center")
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 1.0 - 0.5 / (4.2 * len(names))))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_scale(r: dict[str, Any], path) -> bool:
    """Per data set: held-out accuracy after forgetting at each rate (end and during) beside the exact retrain,
    and the cost per forget (log scale)."""
    made = _figure(r, 2, 15, gridspec_kw={"width_ratios": [3, 1]})
    if made is None:
        return False
    plt, fig, axes, names = made
    for (ax, cx), name in zip(axes, names):
        d = r["datasets"][name]
        fams = [f for f, v in d["families"].items() if "skipped" not in v]
        cols = columns(d)[1:]
        w = 0.8 / len(cols)
        for k, c in enumerate(cols):
            ax.bar([i + (k - (len(cols) - 1) / 2) * w for i in range(len(fams))],
                   [d["families"][f].get(c, 0.0) for f in fams], w, label=c, color=f"C{k}",
                   alpha=1.0 if c.startswith("end") else 0.55)
        ax.axhline(d["reference"]["before"], color="k", ls="--", lw=1, label="exact retrain")
        ax.set_xticks(range(len(fams)), fams, rotation=20, ha="right", fontsize=8)
        ax.set_ylim(0.0, 1.15)  # room above 1 for the legend
        ax.set_ylabel("held-out accuracy")
        ax.set_title(f"{name}: after forgetting at each deletion rate, after the stream (end) and during it "
                     f"(epsilon = {r['epsilon']:g}); a missing bar: not measured", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=7, loc="upper center")
        costs = [(f, d["families"][f].get("forget_us_median")) for f in fams]
        costs = [(f, v) for f, v in costs if v]
        cx.barh([f for f, _ in costs], [v for _, v in costs], color="C7")
        cx.set_xscale("log")
        cx.set_xlabel("µs per forget (median)")
        cx.tick_params(axis="y", labelsize=8)
        cx.invert_yaxis()
        cx.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


SCALE_INTRO = ("Regenerate with `python -m bench --sections scale_accuracy` (the protocol is the docstring of "
               "[bench/scale_accuracy.py](../bench/scale_accuracy.py); `--quick` is a smoke run at 3 000 records that "
               "writes under bench/results/ only).")


def write_docs(r: dict[str, Any], out, docs=None) -> list:
    """Markdown and the plot under ``out``; with ``docs`` also docs/membership.png and the two generated parts of
    docs/accuracy.md (sections "Accuracy at scale" and "Membership inference after forgetting", appended with
    their markers the first time; the prose around the markers is kept)."""
    from pathlib import Path

    from .accuracy import write_generated

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    scale, mia = "\n".join(markdown_scale(r)) + "\n", "\n".join(markdown_mia(r)) + "\n"
    (out / "scale_accuracy.md").write_text(scale + "\n" + mia)
    saved = out / ("scale_accuracy_quick.json" if r.get("quick") else "scale_accuracy.json")  # --merge reads the full one
    saved.write_text(json.dumps(r, indent=1, default=str) + "\n")
    made = [out / "scale_accuracy.md", saved]
    for name, draw in (("membership.png", plot), ("accuracy_scale.png", plot_scale)):
        if draw(r, out / name):
            made.append(out / name)
    if docs is not None:
        docs = Path(docs)
        for name in ("membership.png", "accuracy_scale.png"):
            if (out / name).exists():
                (docs / name).write_bytes((out / name).read_bytes())
                made.append(docs / name)
        doc = docs / "accuracy.md"
        write_generated(doc, SCALE_BEGIN, SCALE_END, scale, f"## Accuracy at scale\n\n{SCALE_INTRO}\n\n")
        write_generated(doc, MIA_BEGIN, MIA_END, mia, "## Membership inference after forgetting\n\n")
        made.append(doc)
    return made


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` (a saved full run) with the families and the sisa sweep of ``new`` (a run of a few families on
    the same streams, e.g. a family added since) put in; ratios and targets recomputed."""
    for name, d in new["datasets"].items():
        if name not in old["datasets"]:
            old["datasets"][name] = d
            continue
        o = old["datasets"][name]
        o["families"].update(d["families"])
        base = o["families"].get("retrain", {}).get("forget_us_median")
        for row in o["families"].values():
            if row.get("forget_us_median") and base:
                row["x_retrain"] = row["forget_us_median"] / base
    for key in ("sisa_sweep", "sisa_small"):
        if new.get(key):
            old[key] = new[key]
    old["seconds"] = old["seconds"] + new["seconds"]
    old.setdefault("merged", []).append(sorted({f for d in new["datasets"].values() for f in d["families"]}))
    old["targets"] = targets(old)
    return old


def main(argv=None) -> None:
    """``python -m bench.scale_accuracy --families sisa --merge``: run some families only and put them into the
    saved full run (bench/results/scale_accuracy.json), then rewrite the docs, as a full run would."""
    import argparse
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser(prog="python -m bench.scale_accuracy", description=main.__doc__)
    ap.add_argument("--families", default=None, help="comma-separated families (default: all)")
    ap.add_argument("--merge", action="store_true", help="merge into bench/results/scale_accuracy.json")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    fams = None if a.families is None else [f.strip() for f in a.families.split(",") if f.strip()]
    r = run(a.quick, fams)
    saved = root / "bench" / "results" / "scale_accuracy.json"
    if a.merge:
        r = merge(json.loads(saved.read_text()), r)
    print("\n".join(table(r)))
    made = write_docs(r, root / "bench" / "results", None if a.quick else root / "docs")
    print("wrote " + ", ".join(str(p) for p in made))


if __name__ == "__main__":
    main()
