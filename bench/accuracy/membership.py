"""Membership inference against a published model, from ``engine.predict`` only (so ensembles work too):
the loss-threshold attack and offline LiRA with shadow models, the AUC of two record sets with a bootstrap
confidence interval.  Used by bench/accuracy/scale_accuracy.py (section ``scale_accuracy``; docs/accuracy.md).

* Loss-threshold attack (Yeom et al. 2018): a record is called a member when the model's confidence on its true
  label is high; the attack's score is that confidence (equivalently minus the per-record log loss).
* Offline LiRA (Carlini et al. 2022, "Membership inference attacks from first principles", section IV.C): N
  shadow models are trained on random halves of a population that contains none of the target records; the
  logit-scaled confidence phi = log(c / (1 - c)) of each target under the shadows ("OUT") is modelled as a
  Gaussian N(mu_i, sigma^2) (per-record mean, one pooled variance: the paper's fixed-variance variant, for few
  shadows); the score of record i under the attacked model is the one-sided z = (phi_i - mu_i) / sigma (large:
  the model is more confident on i than a model that never saw it).  The online variant (IN shadows too) is left
  out: it needs shadow models trained with each target, 2N models per target set.
* AUC of "members" (forgotten or retained records) against never-seen (held-out) records: the Mann-Whitney
  statistic, ties counted one half.  0.5 = the attack cannot tell them apart.  95 % interval: percentile
  bootstrap, both groups resampled with replacement.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

BOOTSTRAP = 400
CLIP = 1e-12


def true_label_confidence(scores: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The model's probability of the true label, from ``engine.predict(X)[1]``: P(class 1) for logistic (n,),
    the K class probabilities for softmax (n x K)."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 2:
        return scores[np.arange(len(y)), np.asarray(y, dtype=np.int64)]
    return np.where(np.asarray(y) > 0.5, scores, 1.0 - scores)


def logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, CLIP, 1.0 - CLIP)
    return np.log(c) - np.log1p(-c)


def _ranks(v: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(v)  # average ranks: ties count one half in the Mann-Whitney statistic


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of a member > score of a non-member) + 1/2 P(tie): the Mann-Whitney U / (n_pos n_neg)."""
    pos, neg = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    if not len(pos) or not len(neg):
        return float("nan")
    r = _ranks(np.concatenate([pos, neg]))[: len(pos)]
    return float((r.sum() - len(pos) * (len(pos) + 1) / 2.0) / (len(pos) * len(neg)))


def auc_ci(pos: np.ndarray, neg: np.ndarray, seed: int = 0, rounds: int = BOOTSTRAP) -> dict[str, Any]:
    """The AUC and its percentile-bootstrap 95 % interval (both groups resampled; fixed seed)."""
    pos, neg = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    point = auc(pos, neg)
    if not len(pos) or not len(neg):
        return {"auc": point, "lo": float("nan"), "hi": float("nan"), "n_pos": len(pos), "n_neg": len(neg)}
    rng = np.random.default_rng(seed)
    boots = [auc(pos[rng.integers(0, len(pos), len(pos))], neg[rng.integers(0, len(neg), len(neg))])
             for _ in range(rounds)]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    # a percentile interval need not contain the point estimate when the bootstrap distribution is skewed (a
    # handful of members); widen it to do so, so that "beyond the interval" keeps its meaning
    return {"auc": point, "lo": float(min(lo, point)), "hi": float(max(hi, point)), "n_pos": len(pos),
            "n_neg": len(neg)}


class Shadows:
    """Offline LiRA's OUT models: ``n_models`` models trained by ``train(X, y)`` (returns an object with
    ``predict``) on random halves of the population (X_pool, y_pool), which holds none of the targets."""

    def __init__(self, train: Callable[[np.ndarray, np.ndarray], Any], X_pool: np.ndarray, y_pool: np.ndarray,
                 n_models: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.models = []
        for _ in range(n_models):
            half = np.sort(rng.permutation(len(y_pool))[: len(y_pool) // 2])  # stream order kept
            self.models.append(train(X_pool[half], y_pool[half]))

    def fit(self, X: np.ndarray, y: np.ndarray) -> "Gaussians":
        """Per-record mean and pooled standard deviation of phi under the OUT models."""
        phi = np.stack([logit(true_label_confidence(m.predict(X)[1], y)) for m in self.models])
        mu = phi.mean(axis=0)
        sd = float(np.sqrt(np.mean((phi - mu) ** 2))) if len(self.models) > 1 else 1.0
        return Gaussians(mu, max(sd, 1e-6))


class Gaussians:
    def __init__(self, mu: np.ndarray, sd: float):
        self.mu, self.sd = mu, sd

    def score(self, phi: np.ndarray) -> np.ndarray:
        """One-sided LiRA statistic: how far above the OUT distribution the attacked model's phi lies."""
        return (phi - self.mu) / self.sd


def attack_scores(scores: np.ndarray, y: np.ndarray, out: Gaussians | None) -> dict[str, np.ndarray]:
    """Both attacks' membership scores of some records (larger = more likely a member)."""
    c = true_label_confidence(scores, y)
    res = {"loss": c}
    if out is not None:
        res["lira"] = out.score(logit(c))
    return res
