"""passive_olu's noise after the stream: today's omega series against the group allocation of issue 30 item 3.

    python -m bench.accuracy.passive_group_allocation [--quick]

The derivation is docs/passive_group_allocation.md.  Forgets after the stream (no learning between them) with the
group allocation sigma_i^2 = (S_i^2 - S_{i-1}^2)/(2 rho), S_i = a_1 + ... + a_i (= (2i - 1) a^2/(2 rho) for equal
shifts a), which keeps the total noise variance at S_i^2/(2 rho) after every forget.  Protocol: the 1e5-record
synthetic stream of bench/accuracy/scale_accuracy.py (d = 32, logistic, the service's default spec fields, epsilon = 1,
delta = 1e-6), passive_olu at its defaults learns it once; then 100 records drawn at random (FORGET_SEED) are
forgotten one per request, and the held-out accuracy is read after 10 and 100 forgets, over SEEDS noise seeds.
"today" is the engine itself (omega series, discrete release, this branch's certified shifts); "group" replays the
same forgets at numpy level: continuous Gaussian noise of the group allocation into the state, projected onto the
ball after each forget as the engine does, with the engine's own certified shifts a_i; "group (engine)" is the engine's allocation "group" itself (discrete release, lattice terms).  "uniform k"
(the cap known in advance) is shown for reference, at numpy level.
"""
from __future__ import annotations

import sys

import numpy as np

from app.unlearning import SeededNoise
from app.unlearning.families.passive import PassiveOLU
from app.unlearning.maths.domain import project_l2_ball
from app.unlearning.maths.losses import augment

from .accuracy import FORGET_SEED, model_spec
from .scale_runs import N_TEST, N_TRAIN, QUICK_TEST, QUICK_TRAIN, synthetic_stream

SEEDS = 20
MARKS = (10, 100)


def accuracy(theta: np.ndarray, Xa: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((Xa @ theta > 0.0) == (y > 0.5)))


def run(quick: bool = False) -> dict[str, list[list[float]]]:
    n, m = (QUICK_TRAIN, QUICK_TEST) if quick else (N_TRAIN, N_TEST)
    data = synthetic_stream(n, m)
    spec = model_spec("passive_olu", data.X_train.shape[1], "logistic", 2, {})
    base = PassiveOLU(spec, SeededNoise(0))
    base.learn(data.X_train, data.y_train)
    state, tau, R, rho = base.state(), base.t, spec.domain_radius, spec.rho
    Xa = augment(data.X_test)
    order = np.random.default_rng(FORGET_SEED).permutation(np.arange(1, n + 1))[: max(MARKS)]
    out: dict[str, list[list[float]]] = {"before": [[accuracy(base.theta, Xa, data.y_test)]]}
    group_spec = model_spec("passive_olu", data.X_train.shape[1], "logistic", 2, {"allocation": "group"})
    for name in ("today", "group", "group engine") + tuple(f"uniform {k}" for k in MARKS):
        out[name] = []
    for seed in range(SEEDS):
        g = PassiveOLU.from_state(group_spec, state, SeededNoise(seed))  # the engine's allocation "group"
        accs = []
        for i, u in enumerate(order, 1):
            g.forget([int(u)])
            if i in MARKS:
                accs.append(accuracy(g.theta, Xa, data.y_test))
        out["group engine"].append(accs)
        e = PassiveOLU.from_state(spec, state, SeededNoise(seed))
        shifts, accs = [], []
        for i, u in enumerate(order, 1):
            (c,) = e.forget([int(u)])
            shifts.append(c.details["shift"] if c.details["shift"] >= c.details["roundoff_floor"]
                          else c.details["roundoff_floor"])
            if i in MARKS:
                accs.append(accuracy(e.theta, Xa, data.y_test))
        out["today"].append(accs)
        rng = np.random.default_rng(10_000 + seed)
        # the group allocation: total variance S_i^2/(2 rho) after forget i (S_i the summed certified shifts)
        theta, S, accs = base.theta.copy(), 0.0, []
        for i, a in enumerate(shifts, 1):
            var = ((S + a) ** 2 - S**2) / (2.0 * rho)
            S += a
            theta = project_l2_ball(theta + rng.standard_normal(theta.shape) * np.sqrt(var), R)
            if i in MARKS:
                accs.append(accuracy(theta, Xa, data.y_test))
        out["group"].append(accs)
        for k in MARKS:  # uniform with the cap k known in advance: sigma = sqrt(k/(2 rho)) a
            theta = base.theta.copy()
            for a in shifts[:k]:
                theta = project_l2_ball(theta + rng.standard_normal(theta.shape) * a * np.sqrt(k / (2.0 * rho)), R)
            out[f"uniform {k}"].append([accuracy(theta, Xa, data.y_test)])
    return out


def table(out: dict[str, list[list[float]]]) -> list[str]:
    def cell(vals) -> str:
        v = np.asarray(vals)
        return f"{v.mean():.3f} ({v.min():.3f}-{v.max():.3f})"
    lines = ["| allocation | after 10 forgets | after 100 forgets |", "|---|---|---|"]
    lines.append(f"| (before any forget) | {out['before'][0][0]:.3f} | |")
    labels = {"today": "omega series (today)", "group": "group (numpy)", "group engine": "group (engine)"}
    for name, label in labels.items():
        a = np.asarray(out[name])
        lines.append(f"| {label} | {cell(a[:, 0])} | {cell(a[:, 1])} |")
    lines.append(f"| uniform, cap known (10 / 100) | {cell(out['uniform 10'])} | {cell(out['uniform 100'])} |")
    return lines


if __name__ == "__main__":
    print("\n".join(table(run(quick="--quick" in sys.argv))))
