"""Section ``scale_accuracy``: its constants, the synthetic stream, the retained store without copies and the
runs of one family in one scenario (the protocol is bench/accuracy/scale_accuracy.py's docstring)."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from app.unlearning import ALGORITHMS, CapacityExhausted, ForgetError, SeededNoise

from . import membership as M
from .accuracy import declared, model_spec
from .datasets import DATASETS, FORGET_SEED, Prepared, unit_rows

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
    """``bench.accuracy.accuracy.declared`` plus the retained-record cap ``max_records`` = n for a family that keeps the
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


