"""Section ``scale_accuracy``: held-out accuracy and cost per forget at production scale and realistic deletion
rates, every family beside the exact retrain, and membership inference after forgetting
(``python -m bench --sections scale_accuracy``; docs/accuracy.md, "Accuracy at scale" and "Membership inference
after forgetting"; issue 25 items 2 and 3).

Protocol (bench/accuracy/accuracy.py's, at scale; its helpers are reused: ``declared``, ``model_spec``, ``during_plan``,
SeededNoise, epsilon = 1, delta = 1e-6, ``MODEL_DEFAULTS``):

* Data.  No public data set of 1e5 records or more ships inside an installed package (scikit-learn's bundled
  sets have at most 1 797 rows; nothing larger is bundled by the installed packages), so the main stream is
  synthetic and documented: ``synthetic_stream`` -- d = 32, rows uniform on the unit sphere (x_norm = 1), the
  label 1[<w, x> > 0] for a fixed unit vector w, flipped with probability 0.05 (Bayes accuracy 0.95), seeded;
  N_TRAIN = 1e5 records in the stream, N_TEST = 2e4 held out.  Beside it the largest real data set of
  bench.accuracy.accuracy (``digits``, 1 438 records in the stream, softmax over 10 classes).  1e6 records are left out on
  this machine (two shared cores): the families that replay in Python would take hours.
* Every family of ``app.unlearning.ALGORITHMS`` (a new family appears by itself), one noise seed, its default
  hyperparameters except what must be declared (``declared``: the true stream length and number of forgets).
  Learn requests of SCALE_BATCH records.
* Deletion rates RATES = 1e-4, 1e-3, 1e-2 of the stream (k = max(1, round(rate n)) records).  "end": after the
  stream, cumulatively 1e-4, then 1e-3, then 1e-2 forgotten, one record per request, drawn at random (fixed
  seed); accuracy at each.  "during": k forget requests spread evenly through the stream, each for a random record
  learned so far (``bench.accuracy.accuracy.during_plan``); accuracy at the end.  One run per rate.
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
* Membership inference (bench/accuracy/membership.py) at the 1e-2 rate, end and during: the loss-threshold attack and
  offline LiRA (N_SHADOW shadow models: noise-free ``retrain``-family models on random halves of the stream's
  non-target records).  AUC of the forgotten records vs never-seen (held-out) records, and of a sample of retained
  records vs the same never-seen records, with a bootstrap 95 % interval.
"""
from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from app.unlearning import ALGORITHMS, SpecError

from .accuracy import RHO, during_plan, model_spec
from .datasets import DATASETS, DELTA, EPSILON, FORGET_SEED, MODEL_DEFAULTS
from .scale_accuracy_docs import merge, table, targets, write_docs
from .scale_runs import (DURING_BUDGET_S, END_BUDGET_S, LEARN_BUDGET_S, MIA_RATE, N_SHADOW, QUICK_BUDGET_S, RATES,
                         SCALE_BATCH, SISA_SHARDS, SISA_SLICES, SWEEP_BUDGET_S, OverBudget, Targets, datasets,
                         equivalent_after_end, hyperparameters, k_of, masked_model, rate_label, run_during, run_end)

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
    """``sisa`` with S shards (R = its default) on bench.accuracy.accuracy's real data sets, whose streams are small
    (455-3 200 records): held-out accuracy with every record learned, beside S = 1 (one model: the retrain
    family's OGD).  The other side of the sweep above: more shards cost nothing at 1e5 records, but each shard
    learns from n / S records only."""
    from .accuracy import _accuracy
    from .datasets import unsupported

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


def main(argv=None) -> None:
    """``python -m bench.accuracy.scale_accuracy --families sisa --merge``: run some families only and put them into the
    saved full run (bench/results/scale_accuracy.json), then rewrite the docs, as a full run would."""
    import argparse
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser(prog="python -m bench.accuracy.scale_accuracy", description=main.__doc__)
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
