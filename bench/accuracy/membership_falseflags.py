"""How often the membership verdict flags a family that forgets exactly (issue 37 item 7): its false-flag rate.

    python -m bench.accuracy.membership_falseflags [seeds] [first seed]

Runs ``power_run`` at the quick size of the ``membership_power`` section (POWER_QUICK) for the exact families only
(every forget certified exact: a forgotten record is exchangeable with a never-seen one, so any flag is false),
``seeds`` times with consecutive seeds, and reads the verdicts from those runs:

- the old rule: one seed, a leak when either attack's bootstrap interval lies above 0.5 (``power_verdict``);
- the new rule (membership_verdict.leak_verdict) over 2 seeds (the quick section's count) and over 4 (the full
  section's): per attack the seeds' one-sided Mann-Whitney z combined, Bonferroni over the two attacks, alpha 5 %.

Prints, per family and in all, the flagged share with its Wilson 95 % interval.  Nothing is asserted.
"""
from __future__ import annotations

import math
import sys
import time

from .membership import POWER_QUICK, POWER_SEED, power_run
from .membership_verdict import exact_family, leak_verdict, power_verdict

EXACT = ("retrain", "sisa", "exact_ridge", "passive_olu_restart", "discard_and_restart")


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def main() -> None:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    first = int(sys.argv[2]) if len(sys.argv) > 2 else POWER_SEED + 1000
    t0 = time.perf_counter()
    runs: dict[str, list[dict]] = {f: [] for f in EXACT}
    for j in range(seeds):
        r = power_run(list(EXACT), seed=first + j, log=lambda *a: None, **POWER_QUICK)
        for fam, row in r["families"].items():
            if "after" in row and exact_family(row):  # a run whose forgets were not all exact tests nothing here
                runs[fam].append(row)
    print(f"{seeds} seeds from {first}, quick size {POWER_QUICK}, {time.perf_counter() - t0:.0f} s")
    total = {"old, 1 seed": [0, 0], "new, 2 seeds": [0, 0], "new, 4 seeds": [0, 0]}
    for fam, rows in runs.items():
        counts = {"old, 1 seed": [sum(power_verdict(row)["leaks"] for row in rows), len(rows)]}
        for s in (2, 4):
            groups = [rows[i:i + s] for i in range(0, len(rows) - s + 1, s)]
            counts[f"new, {s} seeds"] = [sum(bool(leak_verdict(g)["leaks"]) for g in groups), len(groups)]
        cells = []
        for name, (k, n) in counts.items():
            total[name][0] += k
            total[name][1] += n
            lo, hi = wilson(k, n)
            cells.append(f"{name}: {k}/{n} = {k / max(n, 1):.3f} [{lo:.3f}, {hi:.3f}]")
        print(f"{fam:>20}  " + "   ".join(cells))
    print(f"{'all exact families':>20}  " + "   ".join(
        f"{name}: {k}/{n} = {k / max(n, 1):.3f} [{wilson(k, n)[0]:.3f}, {wilson(k, n)[1]:.3f}]"
        for name, (k, n) in total.items()))


if __name__ == "__main__":
    main()
