"""Membership inference against a published model, from ``engine.predict`` only (so ensembles work too):
the loss-threshold attack and offline LiRA with shadow models, the AUC of two record sets with a bootstrap
confidence interval.  Used by bench/accuracy/scale_accuracy.py (section ``scale_accuracy``; docs/accuracy.md), and by the
section ``membership_power`` below (``power_*``: a setting where the exact retrain memorises, so that a forgotten
AUC of 0.5 means something; docs/accuracy.md, "Membership inference with power"; issue 30 item 4).

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

import math
from typing import Any, Callable

import numpy as np

from .membership_verdict import ATTACKS, exact_family, leak_verdict, power_verdict  # noqa: F401 - re-exported

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
    # handful of members); widen it to do so, so that "beyond the interval" keeps its meaning.  ``p``: the one-sided
    # Mann-Whitney p-value of "pos above neg" (exact under exchangeability up to the normal approximation; what the
    # verdict across seeds combines, membership_verdict.py); nan when every score ties
    from scipy.stats import mannwhitneyu

    p = float(mannwhitneyu(pos, neg, alternative="greater", method="asymptotic").pvalue)
    return {"auc": point, "lo": float(min(lo, point)), "hi": float(max(hi, point)), "n_pos": len(pos),
            "n_neg": len(neg), "p": p}


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


# ---- membership inference with power (issue 30 item 4) -------------------------------------------------------
# The 1e5-record stream of bench/accuracy/scale_accuracy.py gives a retained-vs-never-seen AUC of 0.50-0.52: its models
# do not memorise, so "forgotten records score 0.5" there shows nothing.  Here a setting where the exact retrain
# *does* memorise: d as large as n (each record's own gradient is a sizeable part of its score: under the
# passive schedule eta_t = 1/(mu t) every record's weight in the final iterate is about 1/(mu n), its own
# contribution to <theta, x_i> is O(1/(mu n)) against O(sqrt(n / d)/(mu n)) from all the others), and noisy
# labels (a flipped label is learned only by remembering the record).  Rows on the unit sphere: x_norm = 1,
# the spec's bound.  The attacks and the AUC are the ones above, on ``engine.predict`` (published parameters).
POWER_DIM, POWER_N, POWER_TEST, POWER_FORGET = 400, 400, 1000, 100
POWER_FLIP = 0.2
POWER_SHADOWS = 4
POWER_BATCH = 50
POWER_SEED = 30
POWER_SEEDS = 4        # the section runs seeds POWER_SEED, POWER_SEED + 1, ...: the table, then the summary


def power_stream(n: int = POWER_N, n_test: int = POWER_TEST, dim: int = POWER_DIM, flip: float = POWER_FLIP,
                 n_pool: int | None = None, seed: int = POWER_SEED, with_flips: bool = False):
    """(stream, never-seen, attacker's population): rows uniform on the unit sphere in R^dim, label 1[<w, x> > 0]
    for a fixed unit w, flipped with probability ``flip``; the population (2 n records unless ``n_pool``) is
    another draw from the same distribution, holding none of the targets (LiRA's shadows train on it).
    ``with_flips``: a fourth item, whether each of the total records' labels was flipped (stream, never-seen,
    population, in that order)."""
    from .datasets import unit_rows

    rng = np.random.default_rng(seed)
    n_pool = 2 * n if n_pool is None else n_pool
    total = n + n_test + n_pool
    X = unit_rows(rng.standard_normal((total, dim)))
    w = unit_rows(rng.standard_normal((1, dim)))[0]
    y = (X @ w > 0).astype(np.float64)
    y = np.where(rng.random(total) < flip, 1.0 - y, y)
    cut = (slice(0, n), slice(n, n + n_test), slice(n + n_test, total))
    parts = tuple((X[s], y[s]) for s in cut)
    return parts + ((y != (X @ w > 0)),) if with_flips else parts


class EngineRun:
    """One family's engine driven through a stream (learn requests of POWER_BATCH, one forget per request), the
    retained store or the client-resent record given as the family asks; noise from ``SeededNoise(seed)``
    (explicit: no engine is built without its noise source)."""

    def __init__(self, algorithm: str, X: np.ndarray, y: np.ndarray, n_forget: int, seed: int = 0,
                 noise: bool = True):
        from app.unlearning import ALGORITHMS, SeededNoise

        from .accuracy import declared, model_spec

        cls = ALGORITHMS[algorithm]
        n, dim = X.shape
        hp = declared(algorithm, n, max(1, n_forget))
        if cls.needs_retained_data:  # the service always caps the retained records (bench/accuracy/scale_accuracy.py)
            hp["max_records"] = n
        self.engine = cls(model_spec(algorithm, dim, "logistic", 2, hp, 1.0), SeededNoise(seed) if noise else None)
        self.holds = cls.needs_retained_data or getattr(self.engine, "needs_retained_data", False)
        self.client = getattr(self.engine, "needs_deletion_features", False)
        self.X, self.y = X, y
        self.steps = np.zeros(len(y), dtype=np.int64)
        self.alive = np.zeros(len(y), dtype=bool)
        self.sigmas: list[float] = []
        self.mechanisms: set[str] = set()

    def _store(self, rows: np.ndarray):
        from app.unlearning import ArrayRetained

        return ArrayRetained(self.steps[rows], self.X[rows], self.y[rows])

    def learn(self) -> "EngineRun":
        for s in range(0, len(self.y), POWER_BATCH):
            e = min(s + POWER_BATCH, len(self.y))
            ret = self._store(np.flatnonzero(self.alive)) if self.holds else None
            self.steps[s:e] = self.engine.learn(self.X[s:e], self.y[s:e], ret)
            self.alive[s:e] = True
        return self

    def forget(self, u: int) -> None:
        ret = (self._store(np.array([u])) if self.client else
               self._store(np.flatnonzero(self.alive)) if self.holds else None)
        for c in self.engine.forget([int(self.steps[u])], ret):
            self.sigmas.append(float(c.sigma))
            self.mechanisms.add(str(c.mechanism))
        self.alive[u] = False

    def predict(self, X: np.ndarray):
        return self.engine.predict(X)


def power_attacks(model: Any, X: np.ndarray, y: np.ndarray, groups: dict[str, np.ndarray], out: Gaussians,
                  seed: int = 0) -> dict[str, dict[str, Any]]:
    """Both attacks on ``model`` (anything with ``predict``): per attack, the AUC [95 % interval] of each group
    (indices into X) against the group "never seen"."""
    s = attack_scores(model.predict(X)[1], y, out)
    res: dict[str, dict[str, Any]] = {}
    for attack, v in s.items():
        never = v[groups["never seen"]]
        res[attack] = {g: auc_ci(v[idx], never, seed=seed + j) for j, (g, idx) in enumerate(groups.items())
                       if g != "never seen"}
    return res


def power_run(families: list[str] | None = None, n: int = POWER_N, n_test: int = POWER_TEST, dim: int = POWER_DIM,
              n_forget: int = POWER_FORGET, flip: float = POWER_FLIP, shadows: int = POWER_SHADOWS,
              seed: int = POWER_SEED, log=print) -> dict[str, Any]:
    """Every family (or ``families``) on the memorising stream: learn it, then (a) before any forget, retained vs
    never-seen (the attack's power on that family's published model); (b) after forgetting ``n_forget`` records
    drawn at random (fixed seed), forgotten vs never-seen and the records still retained vs never-seen.  The
    reference is the ``retrain`` family itself: its forgets are exact, sigma = 0.  LiRA's OUT models: ``shadows``
    models of the attacked family on random n-record halves of the attacker's population (2 n other records)."""
    import time

    from app.unlearning import ALGORITHMS, CapacityExhausted, ForgetError, SpecError

    t_all = time.perf_counter()
    (X, y), (Xt, yt), (Xp, yp), flipped = power_stream(n, n_test, dim, flip, seed=seed, with_flips=True)
    forgotten = np.sort(np.random.default_rng(seed + 1).permutation(n)[:n_forget])
    kept = np.setdiff1d(np.arange(n), forgotten)
    XA, yA = np.concatenate([Xt, X]), np.concatenate([yt, y])   # the attacked records: never seen, then stream
    never = np.arange(n_test)
    # the share of flipped labels per group: an exact family's forgotten records are exchangeable with never-seen
    # ones, yet the loss attack's AUC moves with how many flipped (hard) records each group happens to hold
    res: dict[str, Any] = {"n": n, "n_test": n_test, "dim": dim, "flip": flip, "n_forget": n_forget,
                           "shadows": shadows, "batch": POWER_BATCH, "seed": seed, "families": {},
                           "flipped": {"never seen": float(flipped[n:n + n_test].mean()),
                                       "forgotten": float(flipped[:n][forgotten].mean()),
                                       "retained": float(flipped[:n][kept].mean())}}
    for algorithm in ALGORITHMS:
        if families is not None and algorithm not in families:
            continue
        t0 = time.perf_counter()
        row: dict[str, Any] = {}
        try:
            r = EngineRun(algorithm, X, y, n_forget).learn()
        except SpecError as e:
            res["families"][algorithm] = {"skipped": f"refused at creation: {e}"}
            log(f"    {algorithm}: skipped ({e})")
            continue
        # LiRA's OUT models: the attacked family itself (the attacker knows the algorithm and the spec: both are
        # published), learned on random n-record halves of the attacker's population (a pool of 2 n records),
        # each with its own noise seed; no forgets
        t1 = time.perf_counter()
        seeds = iter(range(1000, 1000 + shadows))

        def train(Xs, ys, algorithm=algorithm, seeds=seeds):
            return EngineRun(algorithm, Xs, ys, n_forget, seed=next(seeds)).learn()

        out = Shadows(train, Xp, yp, shadows, seed=seed + 2).fit(XA, yA)
        row["shadow_s"] = time.perf_counter() - t1
        row["accuracy before"] = float(np.mean(r.predict(Xt)[0] == yt))
        row["before"] = power_attacks(r, XA, yA, {"never seen": never, "retained": n_test + np.arange(n)}, out,
                                      seed=1)
        done = 0
        try:
            for u in forgotten:
                r.forget(int(u))
                done += 1
        except (CapacityExhausted, ForgetError) as e:
            row["refused"] = f"refused after {done} forgets ({type(e).__name__})"
        gone = forgotten[:done]
        if done:
            row["after"] = power_attacks(r, XA, yA, {"never seen": never, "forgotten": n_test + gone,
                                                      "retained": n_test + kept}, out, seed=3)
        row.update(done=done, accuracy_after=float(np.mean(r.predict(Xt)[0] == yt)),
                   sigma_mean=float(np.mean(r.sigmas)) if r.sigmas else 0.0, mechanisms=sorted(r.mechanisms),
                   seconds=time.perf_counter() - t0)
        res["families"][algorithm] = row
        log(f"    {algorithm}: {row['seconds']:.1f}s, {done} forgets, retained AUC before "
            f"{row['before']['lira']['retained']['auc']:.3f}, forgotten AUC after "
            f"{row.get('after', {}).get('lira', {}).get('forgotten', {}).get('auc', float('nan')):.3f}")
    res["seconds"] = time.perf_counter() - t_all
    return res


POWER_QUICK = {"n": 120, "n_test": 200, "dim": 120, "n_forget": 30, "shadows": 2}
POWER_COMMAND = "python -m bench --sections membership_power"
POWER_BEGIN = "<!-- generated by python -m bench --sections membership_power (membership inference with power): begin -->"
POWER_END = "<!-- generated by python -m bench --sections membership_power (membership inference with power): end -->"


def power(quick: bool, families: list[str] | None = None, log=print) -> dict[str, Any]:
    """The section ``membership_power``: ``power_run`` at the documented size (``--quick``: POWER_QUICK), with
    the machine and the commit it ran on."""
    import subprocess
    import time

    from ..common import machine

    kw = POWER_QUICK if quick else {}
    t0 = time.perf_counter()
    r = power_run(families, log=log, **kw)
    # the whole setting again with other seeds (stream, forgotten set, noise): one run's 24 intervals miss 0.5
    # about once by chance, so a family is said to leak only when it does so across seeds
    r["replicates"] = [power_run(families, seed=POWER_SEED + j, log=lambda *a: None, **kw)
                       for j in range(1, 2 if quick else POWER_SEEDS)]
    r["seconds_all"] = time.perf_counter() - t0
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):  # pragma: no cover
        commit = "?"
    r.update(quick=quick, machine=machine(), commit=commit)
    return r


def _runs(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [r] + list(r.get("replicates", []))


def family_verdicts(r: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Per family, ``leak_verdict`` over the run and its replicates (every seed; membership_verdict.py)."""
    runs = _runs(r)
    return {fam: leak_verdict([x["families"].get(fam, {}) for x in runs if "after" in x["families"].get(fam, {})])
            for fam in r["families"]}


def _across(v: dict[str, Any] | None) -> str:
    if v is None:
        return "no forgets to test"
    p = f"p {v['loss']['p']:.2g} / {v['lira']['p']:.2g}"
    return (f"**leaks** ({p} over {v['seeds']} seeds)" if v["leaks"] else
            f"no leak over {v['seeds']} seed{'s' if v['seeds'] > 1 else ''} ({p})")


def _cell(v: dict[str, Any] | None) -> str:
    if not v or math.isnan(v["auc"]):
        return "-"
    return f"{v['auc']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]"


def power_table(r: dict[str, Any]) -> list[str]:
    lines = [f"## membership inference with power: n = {r['n']}, d = {r['dim']}, label flips {r['flip']:g}, "
             f"{r['n_forget']} forgotten, {r['n_test']} never seen, {r['shadows']} shadows ({r['seconds']:.0f} s)"]
    verdicts = family_verdicts(r)
    for fam, row in r["families"].items():
        if "skipped" in row:
            lines.append(f"{fam:>20}  skipped: {row['skipped']}")
            continue
        v = verdicts.get(fam)
        for a in ATTACKS:
            lines.append(f"{fam:>20} {a:>5} before {_cell(row['before'][a]['retained']):>24} forgotten "
                         f"{_cell(row.get('after', {}).get(a, {}).get('forgotten')):>24} retained "
                         f"{_cell(row.get('after', {}).get(a, {}).get('retained')):>24}"
                         f"{'  LEAKS' if v and v['leaks'] else ''}")
    return lines


def power_markdown(r: dict[str, Any]) -> list[str]:
    m, fl = r.get("machine", {}), r.get("flipped", {})
    lines = [f"Generated by `{POWER_COMMAND}` (bench/accuracy/membership.py, `power_run`) on {m.get('date_utc', '?')} UTC, "
             f"commit {r.get('commit', '?')}, {m.get('nproc', '?')} cores ({m.get('cpu', '?')}; load average "
             f"{', '.join(f'{x:.1f}' for x in m.get('load_avg', []))}): {r['seconds']:.0f} s for the table, "
             f"{r.get('seconds_all', r['seconds']):.0f} s with the other seeds.", "",
             f"Setting: a stream of n = {r['n']} records in d = {r['dim']} (rows uniform on the unit sphere, x_norm = "
             f"1), label 1[<w, x> > 0] flipped with probability {r['flip']:g}; {r['n_test']} never-seen records from "
             f"the same draw; learn requests of {r['batch']}; then {r['n_forget']} records drawn at random forgotten "
             f"one per request.  Every family with its defaults (epsilon = 1, delta = 1e-6), the stream length and "
             f"number of forgets declared, one noise seed.  Attacks on the published parameters only "
             f"(`engine.predict`): loss threshold (confidence on the true label) and offline LiRA with "
             f"{r['shadows']} shadow models (models of the attacked family, the spec being public, each with its own "
             f"noise seed, on {r['n']}-record halves of an attacker's population of {2 * r['n']} other records from "
             f"the same distribution; LiRA's per-record calibration).  AUC [bootstrap 95 % interval] against the never-seen "
             f"records: **before** any forget, retained (all {r['n']} stream records) -- the attack's power on "
             f"that family; **after** the forgets, the forgotten records (goal: 0.5) and the records still "
             f"retained.  Share of flipped labels: {fl.get('never seen', float('nan')):.3f} of the never-seen, "
             f"{fl.get('forgotten', float('nan')):.3f} of the forgotten, {fl.get('retained', float('nan')):.3f} of "
             f"the retained records (the loss attack, uncalibrated, moves with it; LiRA calibrates each record).",
             "",
             "| family | attack | before: retained | after: forgotten | after: retained | σ mean | accuracy "
             "before → after | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    verdicts = family_verdicts(r)
    for fam, row in r["families"].items():
        if "skipped" in row:
            lines.append(f"| {fam} | - | skipped: {row['skipped']} | | | | | |")
            continue
        v = power_verdict(row)
        verdict = ("exact; " if exact_family(row) else "") + _across(verdicts.get(fam))
        verdict += ("; no power on this model (before: retained AUC < 0.6 or its interval reaches 0.5)"
                    if not v["power"] else
                    "" if v["power_after"] else "; no power left after the forgets (after: retained < 0.6)")
        if row.get("refused"):
            verdict += f"; {row['refused']}"
        for a in ATTACKS:
            after = row.get("after", {}).get(a, {})
            lines.append(f"| {fam} | {a} | {_cell(row['before'][a]['retained'])} | {_cell(after.get('forgotten'))} "
                         f"| {_cell(after.get('retained'))} | {row['sigma_mean']:.3g} | {row['accuracy before']:.3f} → "
                         f"{row['accuracy_after']:.3f} | {verdict} |")
    exact = [f for f, row in r["families"].items() if "skipped" not in row and exact_family(row)]
    leak = [f for f, v in verdicts.items() if v and v["leaks"]]
    lines += ["", f"Exact families (every forget certified exact, σ = 0): {', '.join(exact) or 'none'}.  "
                  f"Families whose forgotten records an attack tells apart from never-seen ones: "
                  f"{', '.join(leak) or 'none'} -- the verdict column: over all {len(_runs(r))} seeds, each "
                  f"attack's one-sided Mann-Whitney z-scores combined (Stouffer), an attack's combined p below "
                  f"0.025 (Bonferroni over the two attacks: a family that forgets exactly is flagged with "
                  f"probability at most 5 %; bench/accuracy/membership_verdict.py).  The intervals are the first "
                  f"seed's; with {2 * len(r['families'])} of them, about one in twenty misses 0.5 by chance alone."]
    return lines + power_across_seeds(r)


def power_across_seeds(r: dict[str, Any]) -> list[str]:
    """Per family, over the run and its ``replicates`` (other seeds): each seed's forgotten-vs-never-seen AUC
    (loss / LiRA), their mean, how many of the 2 x seeds intervals lie above 0.5, and the verdict over all seeds
    (``leak_verdict``: each attack's combined p, Bonferroni over the two)."""
    runs = [r] + list(r.get("replicates", []))
    if len(runs) < 2:
        return []
    lines = ["", f"Across {len(runs)} seeds ({', '.join(str(x.get('seed', '?')) for x in runs)}: a new stream, "
                 f"forgotten set and noise each): forgotten vs never-seen AUC, loss / LiRA, per seed.", "",
             "| family | " + " | ".join(f"seed {x.get('seed', '?')}" for x in runs) +
             " | mean loss / LiRA | intervals above 0.5 | before: retained (loss, mean) | combined p loss / LiRA "
             "| verdict |",
             "|---|" + "---|" * (len(runs) + 5)]
    for fam in r["families"]:
        rows = [x["families"].get(fam, {}) for x in runs]
        if any("after" not in row for row in rows):
            continue
        f = [[row["after"][a]["forgotten"] for a in ATTACKS] for row in rows]
        mean = [float(np.mean([c[i]["auc"] for c in f])) for i in range(len(ATTACKS))]
        above = sum(v["lo"] > 0.5 for c in f for v in c)
        power = float(np.mean([row["before"]["loss"]["retained"]["auc"] for row in rows]))
        lv = leak_verdict(rows)
        lines.append(f"| {fam}{' (exact)' if all(exact_family(row) for row in rows) else ''} | " +
                     " | ".join(" / ".join(f"{v['auc']:.3f}" for v in c) for c in f) +
                     f" | {mean[0]:.3f} / {mean[1]:.3f} | {above} of {2 * len(runs)} | {power:.3f} | "
                     f"{lv['loss']['p']:.3g} / {lv['lira']['p']:.3g} | {'**leaks**' if lv['leaks'] else 'no leak'} |")
    return lines


def power_write_docs(r: dict[str, Any], out, docs=None) -> list:
    """bench/results/membership_power.{md,json}; with ``docs`` also the generated part "Membership inference
    with power" of docs/accuracy.md (appended with its markers the first time; the prose around is kept)."""
    import json
    from pathlib import Path

    from .accuracy_docs import write_generated

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(power_markdown(r)) + "\n"
    name = "membership_power_quick" if r.get("quick") else "membership_power"
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(r, indent=1, default=str) + "\n")
    made = [out / f"{name}.md", out / f"{name}.json"]
    if docs is not None:
        doc = Path(docs) / "accuracy.md"
        write_generated(doc, POWER_BEGIN, POWER_END, text, "## Membership inference with power\n\n")
        made.append(doc)
    return made
