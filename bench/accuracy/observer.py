"""Section ``observer`` (issue 38 items 1 and 4): what a before/after observer of a model's published versions
recovers of a forgotten record, per family.

Protocol.  A synthetic stream (rows uniform on the unit sphere, label 1[<w, x> > 0] flipped with probability 0.05:
bench/accuracy/scale_runs.py), n records learned in requests of 50, then ``forgets`` single-record forgets, each
of a record drawn at random among those held.  The observer reads the published parameters before and after each
forget (a predict-scope key can: GET /parameters, or d + 1 predicts) and inverts their difference:

* gradient inversion.  Near the model, removing record z moves the parameters by about H^-1 g(z) / n, with
  g(z) = l'(theta . x~_z, y_z) x~_z (logistic, OGD: retrain and sisa's shard) or x~_z (W x~_z - t_z)^T (ridge);
  so v = H (theta_before - theta_after) is proportional to x~_z, whose last coordinate is 1: x^ = v[:-1] / v[-1].
  H is estimated from a **population sample** of 500 other records (the observer knows the population, not the
  data): the logistic Hessian at theta_after (plus l2), or sum x~ x~^T (plus l2) scaled to n for ridge.  For a
  ridge model's K outputs v is the top left singular vector of H (W_after - W_before)^T.  sisa: the difference of
  the one shard model that changed (its parameters are published per shard), H scaled to the shard's size.
* what is reported: the cosine between x^ and the record's x (median), the label read off the sign of v's last
  coordinate (logistic: removal moves theta against g, so v[-1] > 0 means y = 1; the share right), and the
  record's **rank** among the records held before the forget when each candidate j is scored by the cosine
  between v and its own predicted direction (logistic: -(sigma(theta_after . x~_j) - y_j) x~_j; ridge: x~_j),
  as the share of forgets where it ranks first and the median rank.

Families: ``retrain``, ``sisa`` (default shards for max_records = n), ``exact_ridge`` exact and private
(a release per request: release_horizon = requests + forgets, l2 = 1), and ``passive_olu`` (a noise family) for reference; epsilon = 1,
delta = 1e-6.  ``python -m bench --sections observer`` (``--quick``: n = 500, 10 forgets).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from .membership import POWER_BATCH, EngineRun
from .scale_runs import synthetic_stream

N, FORGETS, DIM, POPULATION = 2000, 40, 16, 500
QUICK_N, QUICK_FORGETS = 500, 10
FAMILIES = ("retrain", "sisa", "exact_ridge", "exact_ridge_private", "passive_olu")


def _sigmoid(s: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(s, -40, 40)))


def _aug(X: np.ndarray) -> np.ndarray:
    return np.hstack([X, np.ones((len(X), 1))])


class Observer:
    """One family's run: learn the stream, then forget records one at a time, recording before/after versions."""

    def __init__(self, family: str, X: np.ndarray, y: np.ndarray, forgets: int, seed: int):
        algorithm = "exact_ridge" if family.startswith("exact_ridge") else family
        self.run = EngineRun(algorithm, X, y, forgets, seed=seed)
        if family == "exact_ridge_private":  # the same model, published privately
            from app.unlearning import ALGORITHMS, SeededNoise

            from .accuracy import model_spec
            hp = {"publication": "private", "release_horizon": -(-len(y) // POWER_BATCH) + forgets}
            spec = model_spec("exact_ridge", X.shape[1], "logistic", 2, hp, 1.0, l2=1.0)
            self.run.engine = ALGORITHMS["exact_ridge"](spec, SeededNoise(seed))
        self.family, self.ridge = family, algorithm == "exact_ridge"
        self.spec = self.run.engine.spec

    def published(self) -> np.ndarray:
        return np.asarray(self.run.engine.published(), dtype=np.float64)


def _hessian(obs: Observer, theta: np.ndarray, P: np.ndarray, n: float) -> np.ndarray:
    """H estimated from the population sample P (rows x~), scaled to n records, plus the penalty."""
    l2 = obs.spec.l2
    if obs.ridge:
        return (n / len(P)) * (P.T @ P) + l2 * np.eye(P.shape[1])
    s = _sigmoid(P @ theta)
    return (n / len(P)) * ((P * (s * (1 - s))[:, None]).T @ P) + l2 * n * np.eye(P.shape[1])


def _direction(obs: Observer, before: np.ndarray, after: np.ndarray, P: np.ndarray, n: int, use_h: bool):
    """(v, theta_after of the changed model): v ~ x~ of the forgotten record (module docstring); ``use_h`` False:
    v is the raw difference (H = I), the better inversion where the model is far from an optimum (one OGD pass)."""
    p = P.shape[1]
    if obs.ridge:
        k = max(1, obs.spec.n_classes)
        Wb, Wa = before.reshape(k, p), after.reshape(k, p)
        V = (_hessian(obs, Wa[0], P, n) if use_h else np.eye(p)) @ (Wa - Wb).T
        u = np.linalg.svd(V, full_matrices=False)[0][:, 0]
        return u / (u[-1] if abs(u[-1]) > 0 else 1.0), Wa
    if obs.family == "sisa":
        Tb, Ta = before.reshape(-1, p), after.reshape(-1, p)
        j = int(np.argmax(np.abs(Tb - Ta).sum(axis=1)))  # the shard that changed
        before, after, n = Tb[j], Ta[j], n / len(Tb)
    return (_hessian(obs, after, P, n) if use_h else np.eye(p)) @ (before - after), after


def attack(family: str, n: int, forgets: int, seed: int = 0) -> dict[str, Any]:
    data = synthetic_stream(n + POPULATION, 10, DIM, seed=seed)
    X, y = data.X_train[:n], data.y_train[:n]
    P = _aug(data.X_train[n:])
    obs = Observer(family, X, y, forgets, seed)
    t0 = time.perf_counter()
    obs.run.learn()
    rng = np.random.default_rng(seed + 1)
    cos, label_ok, ranks = ([], []), ([], []), ([], [])  # per attack: H from the population sample, H = I
    for u in rng.choice(n, forgets, replace=False):
        before = obs.published()
        held = np.flatnonzero(obs.run.alive)
        obs.run.forget(int(u))
        after = obs.published()
        if np.array_equal(before, after):  # nothing published moved (e.g. a private model between releases)
            for k in (0, 1):
                cos[k].append(0.0), label_ok[k].append(0.5), ranks[k].append(len(held) / 2)
            continue
        C = _aug(X[held])
        for k, use_h in enumerate((True, False)):
            v, theta = _direction(obs, before, after, P, len(held), use_h)
            x_hat = v[:-1] / v[-1] if v[-1] != 0 else v[:-1]
            cos[k].append(float(x_hat @ X[u] / (np.linalg.norm(x_hat) * np.linalg.norm(X[u]) + 1e-300)))
            label_ok[k].append(float((v[-1] > 0) == (y[u] == 1)) if not obs.ridge else float("nan"))
            if obs.ridge:
                score = np.abs(C @ v) / (np.linalg.norm(C, axis=1) * np.linalg.norm(v))
            else:
                th = theta if theta.ndim == 1 else theta[0]
                g = -(_sigmoid(C @ th) - y[held])[:, None] * C
                score = (g @ v) / (np.linalg.norm(g, axis=1) * np.linalg.norm(v) + 1e-300)
            ranks[k].append(1 + int(np.sum(score > score[np.searchsorted(held, u)])))
    out: dict[str, Any] = {"family": family, "n": n, "forgets": forgets, "seconds": round(time.perf_counter() - t0, 1)}
    for k, name in enumerate(("population_h", "raw")):
        ranks_a = np.asarray(ranks[k], dtype=float)
        lab = [v for v in label_ok[k] if v == v]
        out[name] = {"cosine_median": float(np.median(cos[k])), "label_right": float(np.mean(lab)) if lab else None,
                     "first": float(np.mean(ranks_a == 1)), "rank_median": float(np.median(ranks_a))}
    return out


def run(quick: bool, families: tuple[str, ...] = FAMILIES) -> dict[str, Any]:
    n, forgets = (QUICK_N, QUICK_FORGETS) if quick else (N, FORGETS)
    return {"n": n, "forgets": forgets, "dim": DIM, "rows": [attack(f, n, forgets) for f in families]}


def table(r: dict[str, Any]) -> list[str]:
    lines = [f"## Observer of versions: gradient inversion of a 1-record difference (n = {r['n']}, d = {r['dim']}, "
             f"{r['forgets']} forgets; H from a 500-record population sample, or H = I)",
             f"{'family':<22}{'attack':<14}{'cosine x^ vs x (median)':>25}{'label right':>13}{'ranked 1st':>12}"
             f"{'median rank':>13}"]
    for row in r["rows"]:
        for name in ("population_h", "raw"):
            a = row[name]
            lab = "-" if a["label_right"] is None else f"{a['label_right']:.2f}"
            lines.append(f"{row['family']:<22}{name:<14}{a['cosine_median']:>25.3f}{lab:>13}{a['first']:>12.2f}"
                         f"{a['rank_median']:>13.0f}")
    return lines
