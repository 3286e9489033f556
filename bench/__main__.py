"""Benchmark runner: ``python -m bench [--sections engine,http,forget,memory,profiles] [--quick]``.

``python -m bench --render bench/results/results.json [--docs]`` measures nothing: it rewrites what a run writes
besides results.json from that saved run: the generated parts of docs/accuracy.md and docs/performance.md (byte for
byte) and the plots.

Runs the selected sections, prints one table per section with ratios against the baselines measured in the same
run, writes ``bench/results/results.json`` and PNG plots under ``bench/results/`` (``--docs`` also copies the
summary plots to ``docs/`` and rewrites each run section's generated block of docs/performance.md: its run line --
date, commit, machine -- and its table; bench/performance/docs.py).  Nothing here is asserted by the tests; numbers depend on the machine and its load.
Sections: engine (learn throughput vs river and a numpy loop), http (service ingest and latency vs a bare FastAPI
endpoint), forget (forget(1) vs retraining as the stream grows, every family), memory (state blob, resident engine,
database bytes per example), profiles (pyinstrument/py-spy evidence for the misses), noise (17 exact discrete
Gaussian draws, compiled and pure, vs today's continuous standard_normal(17)), stream (learn events through NATS
JetStream and ``olu consume`` vs HTTP ingest; needs NATS at 127.0.0.1:4222), accuracy (held-out accuracy before
and after forgetting 1 record, 1 % and 10 % of the stream, every family, beside the exact retrain and river's single
pass; a full run rewrites the generated part of docs/accuracy.md and docs/accuracy.png; bench/accuracy/accuracy.py;
then feature_maps), feature_maps (exact_ridge linear and on public rbf maps of 1 024 and 2 048 centres over HTTP on
KEEL letter and MAGIC, digits, breast-cancer and the 1e5 stream, beside logistic and HistGradientBoosting retrains,
before and after forgetting 1 % and 10 %, with learn, forget and predict costs; OLU_BENCH_MAPS=letter,magic picks
data sets; a full run rewrites its part of docs/accuracy.md; bench/accuracy/feature_maps.py),
scale (aggregate learn events/s and predict requests/s for 1, 2, 4, 8 replicas or workers, servers and load
generators pinned to separate cores; bench/scale/scale.py), fairness (one tenant floods predicts and learns from 4 keys and
4 processes at nice 19 while another measures its predict p50/p99, alone and under the flood in alternate windows,
with everything off, the tenant limits without the compute scheduler, and the defaults; target: p99 under the flood
within 2x of p99 alone; ``--server-cpus 0,1`` pins the server to 2 cores; bench/performance/fairness.py; then the
request shapes of issue 37: one tenant sends hashed dim-1e5 predicts and learns or 19 MiB learn bodies in JSON, columnar
JSON and msgpack, one at a time, while the other's p99 is measured the same way; bench/performance/fairness_shapes.py), coldstart (first-request latency of a service started on an empty numba cache vs a warm one; bench/performance/coldstart.py),
scale_accuracy (held-out accuracy and cost per forget on a 1e5-record stream at deletion rates 1e-4, 1e-3, 1e-2,
every family beside the exact retrain, and membership inference on the forgotten records; a full run rewrites
the generated "Accuracy at scale" and "Membership inference after forgetting" parts of docs/accuracy.md and
docs/membership.png; bench/accuracy/scale_accuracy.py), membership_power (membership inference in a setting where the
exact retrain memorises -- d = n = 400, label flips 0.2 -- before and after forgetting 100 records, every family;
a full run rewrites the generated "Membership inference with power" part of docs/accuracy.md;
bench/accuracy/membership.py), replay (exact forgets of retrain and sisa at 1e4-1e6 records, compiled
and fallback loop, descent_to_delete learning in requests of 1 000, the retained-example read rate; bench/performance/replay.py),
scale_n (learn per example, forget, memory and database bytes per record at 1e4-1e7 records for every family, with
a per-family time cap; accuracy at 1e6; ``--docs`` rewrites its generated part of docs/performance.md; bench/performance/scale_n.py), models (10^4 models
of one tenant and of 100 tenants on one PostgreSQL: learn, predict and unlearn p50/p99 against a single model in the
same run, database bytes and server memory; a full run rewrites its generated part of docs/performance.md;
bench/scale/models.py), ridge_cost (exact_ridge's learn, forget and solve before and after the two-word sums and
the one-thread solve, GCV and a private release; bench/performance/ridge_cost.py), observer (what a before/after
observer of the published versions recovers of a forgotten record, per family: gradient inversion;
bench/accuracy/observer.py), private_accuracy (exact_ridge's private publication at 1e4-1e6 records, the release
cadence as a column, beside the exact publication and the noise families; a full run rewrites its generated part of
docs/accuracy.md; bench/accuracy/private_ridge.py), service_scale (sisa, retrain, exact_ridge and passive_olu
through HTTP at ``--sizes`` records (default 1e5,1e6) on each of ``--backends``: ingest and forget p50/p99 beside the
engine of the same specs; bench/performance/service_scale.py).
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from .common import fmt_rate, fmt_time, machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SECTIONS = ("engine", "http", "forget", "memory", "profiles", "noise", "stream", "scale", "coldstart", "fairness",
            "accuracy", "scale_accuracy", "replay", "scale_n", "models", "membership_power", "ridge_cost", "observer",
            "private_accuracy", "feature_maps", "service_scale")
DEFAULT_SECTIONS = SECTIONS[:7]  # the performance sections; scale, coldstart, fairness, accuracy, scale_accuracy,
# replay, scale_n, models, membership_power, ridge_cost, observer, private_accuracy, service_scale run when named

TARGETS = {
    "engine_vs_river_d64": ("engine >= 10x river learn_one at d = 64", 10.0),
    "ridge_vs_passive_engine_d64": ("exact_ridge learn ingest >= 0.5x passive_olu's at the engine, d = 64", 0.5),
    "ridge_vs_passive_http_d64": ("exact_ridge learn ingest >= 0.5x passive_olu's over HTTP (SQLite, d = 64)", 0.5),
    "ingest_1000_vs_bare": ("batch ingest (1000, d = 64, durable) >= 4x bare FastAPI pydantic endpoint", 4.0),
    "unlearn1_p50_sqlite": ("passive unlearn(1) p50 <= 5 ms on SQLite (signing + commit)", 0.005),
    "predict_p50_sqlite": ("predict p50 <= 2 ms", 0.002),
    "forget_vs_retrain_1e5": ("forget >= 1000x cheaper than retraining at 1e5 events (passive OLU)", 1000.0),
}


def _engine_table(r: dict) -> list[str]:
    lines = ["## 1. Engine learn throughput (events/s, median), passive OLU logistic",
             f"{'d':>4} {'OLU fast batch':>15} {'OLU fast 1/call':>16} {'OLU numpy':>10} {'numpy loop':>11} "
             f"{'river':>8} {'x river':>8} {'x river 1/call':>15} {'x numpy loop':>13}"]
    for row in r["rows"]:
        lines.append(f"{row['d']:>4} {fmt_rate(row.get('olu_fast_batch')):>15} {fmt_rate(row.get('olu_fast_event')):>16} "
                     f"{fmt_rate(row['olu_numpy_batch']):>10} {fmt_rate(row['numpy_loop']):>11} "
                     f"{fmt_rate(row.get('river')):>8} {_x(row.get('ratio_vs_river')):>8} "
                     f"{_x(row.get('ratio_event_vs_river')):>15} {_x(row['ratio_vs_numpy_loop']):>13}")
    lines.append(f"compiled vs numpy path, max |theta difference| at d=64: {r['max_abs_gap_fast_vs_numpy_d64']}")
    if r.get("exact_ridge_d64"):
        e = r["exact_ridge_d64"]
        lines.append(f"exact_ridge vs passive_olu, d = 64, requests of {e['batch']}, published weights read after "
                     f"each: {fmt_rate(e['events_per_s']['exact_ridge'])} vs "
                     f"{fmt_rate(e['events_per_s']['passive_olu'])} events/s ({e['ratio']:.2f})")
    return lines


def _noise_table(r: dict) -> list[str]:
    base = r["standard_normal_s"]
    lines = [f"## noise: {r['size']} draws per call, median per call "
             f"(today's continuous standard_normal({r['size']}): {base * 1e6:.2f} us)",
             f"{'sigma (grid)':>13} {'discrete compiled':>18} {'discrete pure':>14} {'compiled/normal':>16}"]
    for row in r["rows"]:
        c = row.get("compiled_s")
        ratio = f"{c / base:.1f}x" if c else "-"
        comp = f"{c * 1e6:.2f} us" if c else "-"
        lines.append(f"{row['sigma']:>13g} {comp:>18} {row['pure_s'] * 1e6:>11.0f} us {ratio:>16}")
    return lines


def _x(v) -> str:
    return "-" if v is None else f"{v:.1f}x" if v < 100 else f"{v:.0f}x"


def _http_table(r: dict) -> list[str]:
    lines = [f"## 2. Service ingest over HTTP (d = {r['d']}, events/s = batch / median request time)",
             f"{'backend':>10} {'shape':>9} {'batch':>6} {'events/s':>9} {'p50':>10} {'p99':>10} {'x bare':>7}"]
    for name, row in r["bare_fastapi"].items():
        lines.append(f"{'bare':>10} {row['shape']:>9} {row['batch']:>6} {fmt_rate(row['events_per_s']):>9} "
                     f"{fmt_time(row['p50_s']):>10} {fmt_time(row['p99_s']):>10} {'1.0x':>7}")
    for backend, b in r["backends"].items():
        for name, row in b["ingest"].items():
            lines.append(f"{backend:>10} {row['shape']:>9} {row['batch']:>6} {fmt_rate(row['events_per_s']):>9} "
                         f"{fmt_time(row['p50_s']):>10} {fmt_time(row['p99_s']):>10} {_x(row['ratio_vs_bare']):>7}")
    for backend, b in r["backends"].items():
        if b.get("families_1000"):
            f = b["families_1000"]
            lines.append(f"{backend:>10} exact_ridge vs passive_olu, {f['shape']}, requests of {f['batch']}: "
                         f"{fmt_rate(f['events_per_s']['exact_ridge'])} vs {fmt_rate(f['events_per_s']['passive_olu'])}"
                         f" events/s ({f['ratio']:.2f})")
    lines.append("")
    lines.append(f"{'backend':>10} {'operation':>11} {'p50':>10} {'p99':>10}")
    for backend, b in r["backends"].items():
        for op, v in b["latency"].items():
            lines.append(f"{backend:>10} {op:>11} {fmt_time(v['p50_s']):>10} {fmt_time(v['p99_s']):>10}")
    lines += [f"note: {n}" for n in r.get("notes", [])]
    return lines


def _forget_table(r: dict) -> list[str]:
    nr = r.get("numpy_retrain")
    extra = [f"passive_olu retrain on the numpy loop (compiled path off), n = {nr['n']}: {fmt_time(nr['seconds'])}"] \
        if nr else []
    lines = [f"## 3. forget(1) vs retraining from scratch (engine level, d = {r['d']}, median)", *extra,
             f"{'family':>20} {'n':>8} {'forget':>10} {'retrain':>10} {'retrain/forget':>15} {'mechanism':>10}"]
    for fam, v in r["families"].items():
        for row in v["rows"]:
            lines.append(f"{fam:>20} {row['n']:>8} {fmt_time(row['forget_s']):>10} {fmt_time(row['retrain_s']):>10} "
                         f"{_x(row['ratio']):>15} {str(row['mechanism']):>10}")
        if v["capped"]:
            lines.append(f"{fam:>20} sizes {v['capped']} skipped: projected learning time above "
                         f"{r['cap_seconds']:.0f} s")
    return lines


def _memory_table(r: dict) -> list[str]:
    lines = ["## 4. Memory", f"{'family':>20} {'n':>7} {'state blob':>11} {'resident engine':>16}"]
    for fam, v in r["engine"].items():
        lines.append(f"{fam:>20} {v['n']:>7} {v['state_blob_bytes']:>9} B {v['resident_bytes']:>14} B")
    db = r["database"]
    lines.append(f"database bytes per learned example (n = {db['n']}, d = {db['d']}, tables with their indexes):")
    for backend, fams in db["backends"].items():
        for fam, v in fams.items():
            parts = ", ".join(f"{k} {val:.0f}" for k, val in v["per_example_bytes"].items())
            at = f", n = {v['n']}" if v.get("n", db["n"]) != db["n"] else ""
            lines.append(f"  {backend:>10} {fam:>12}: {v['total_per_example']:.0f} B ({parts}){at}")
    lines += [f"note: {n}" for n in db.get("notes", [])]
    return lines


def _profiles_table(r: dict) -> list[str]:
    lines = ["## profiles: " + ", ".join(f"{k} = {fmt_time(v)}" for k, v in r.items() if not isinstance(v, dict))]
    return lines + [f"  {k}: " + ", ".join(f"{n} {fmt_time(t)}" for n, t in v.items())
                    for k, v in r.items() if isinstance(v, dict)]


def _module_table(package: str, module: str):
    def table(r: dict) -> list[str]:
        import importlib
        return importlib.import_module(f"bench.{package}.{module}").table(r)
    return table


# the printed table of each section, for docs/performance.md's generated blocks (bench/performance/docs.py)
TABLES = {"engine": _engine_table, "http": _http_table, "forget": _forget_table, "noise": _noise_table,
          "memory": _memory_table, "profiles": _profiles_table, "stream": _module_table("performance", "stream"),
          "coldstart": _module_table("performance", "coldstart"), "scale": _module_table("scale", "scale"),
          "replay": _module_table("performance", "replay")}


def _accuracy_docs_section(res: dict, name: str, a, run, table, write_docs) -> None:
    """Run a section that owns generated parts of docs/accuracy.md, print its table, and write its files; like
    accuracy, a full run rewrites its docs parts (--quick only with --docs)."""
    res[name] = run(a.quick)
    print("\n".join(table(res[name])))
    made = write_docs(res[name], a.out, ROOT / "docs" if a.docs or not a.quick else None)
    print("wrote " + ", ".join(str(p) for p in made))


def _feature_maps(res: dict, a) -> None:
    from .accuracy import feature_maps, feature_maps_docs
    _accuracy_docs_section(res, "feature_maps", a, feature_maps.run, feature_maps_docs.table,
                           feature_maps_docs.write_docs)


def targets(res: dict) -> dict:
    out = {}

    def put(key, value, ok):
        desc, goal = TARGETS[key]
        out[key] = {"target": desc, "goal": goal, "measured": value, "met": None if value is None else bool(ok)}

    if "engine" in res:
        row = next(r for r in res["engine"]["rows"] if r["d"] == 64)
        v = row.get("ratio_vs_river")
        put("engine_vs_river_d64", v, v is not None and v >= 10)
        if res["engine"].get("exact_ridge_d64"):
            v = res["engine"]["exact_ridge_d64"]["ratio"]
            put("ridge_vs_passive_engine_d64", v, v >= 0.5)
    if "http" in res and res["http"]["backends"].get("sqlite"):
        sq = res["http"]["backends"]["sqlite"]
        ratios = {b: v["best_1000_ratio_vs_bare"] for b, v in res["http"]["backends"].items()}
        v = min(ratios.values())
        put("ingest_1000_vs_bare", v, v >= 4)
        out["ingest_1000_vs_bare"]["per_backend"] = ratios
        v = sq["latency"]["unlearn(1)"]["p50_s"]
        put("unlearn1_p50_sqlite", v, v <= 0.005)
        v = sq["latency"]["predict"]["p50_s"]
        put("predict_p50_sqlite", v, v <= 0.002)
        if sq.get("families_1000"):
            v = sq["families_1000"]["ratio"]
            put("ridge_vs_passive_http_d64", v, v >= 0.5)
    if "forget" in res:
        rows = [r for r in res["forget"]["families"]["passive_olu"]["rows"] if r["n"] == 100_000]
        v = rows[0]["ratio"] if rows else None
        put("forget_vs_retrain_1e5", v, v is not None and v >= 1000)
        nr = res["forget"].get("numpy_retrain")
        if rows and nr and nr["n"] == 100_000:
            out["forget_vs_retrain_1e5"]["vs_numpy_retrain"] = nr["seconds"] / rows[0]["forget_s"]
    return out


def plots(res: dict, out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    if "engine" in res:
        rows = res["engine"]["rows"]
        keys = [("olu_fast_batch", "OLU compiled, batch"), ("olu_fast_event", "OLU compiled, 1/call"),
                ("olu_numpy_batch", "OLU numpy"), ("numpy_loop", "plain numpy OGD"), ("river", "river learn_one")]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        w = 0.16
        for k, (key, label) in enumerate(keys):
            ax.bar([i + (k - 2) * w for i in range(len(rows))], [r.get(key) or 0 for r in rows], w, label=label)
        ax.set_xticks(range(len(rows)), [f"d = {r['d']}" for r in rows])
        ax.set_yscale("log")
        ax.set_ylabel("events / s (median)")
        ax.set_title("Engine learn throughput, passive OLU logistic")
        ax.legend(fontsize=8)
        fig.tight_layout()
        made.append(out / "engine_throughput.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    if "http" in res and res["http"]["backends"]:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        batches = [1, 100, 1000]
        bare = res["http"]["bare_fastapi"]
        ax.plot(batches, [bare[f"examples/{b}"]["events_per_s"] for b in batches], "k--", marker="o",
                label="bare FastAPI + pydantic (no DB)")
        for backend, b in res["http"]["backends"].items():
            for shape, style in (("examples", "-"), ("columnar", "-."), ("msgpack", ":")):
                ax.plot(batches, [b["ingest"][f"{shape}/{n}"]["events_per_s"] for n in batches], style, marker="o",
                        label=f"service {backend}, {shape}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("events / s (batch / median request time)")
        ax.set_title(f"Ingest over HTTP, d = {res['http']['d']}, durable commits")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(out / "http_ingest.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    if "forget" in res:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for k, (fam, v) in enumerate(res["forget"]["families"].items()):
            rows = [r for r in v["rows"] if r["forget_s"]]
            color = f"C{k}"
            ax.plot([r["n"] for r in rows], [r["forget_s"] for r in rows], "-", marker="o", color=color,
                    label=f"{fam}: forget(1)")
            ax.plot([r["n"] for r in rows], [r["retrain_s"] for r in rows], ":", marker="x", color=color,
                    label=f"{fam}: retrain")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("events learned")
        ax.set_ylabel("seconds (median)")
        ax.set_title("Forget one record vs retrain from scratch (engine, d = 16)")
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        made.append(out / "forget_vs_retrain.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made


def render(res: dict, out: Path, docs: Path, to_docs: bool) -> list[Path]:
    """``--render``: what a run writes besides results.json, rebuilt from a saved results.json without measuring:
    the generated parts of docs/accuracy.md and their plots (into ``docs`` as the run did: after a --quick run only
    with --docs) and the summary plots (copied to docs/ with --docs)."""
    into = docs if to_docs or not res.get("quick") else None
    made: list[Path] = []
    if "accuracy" in res:
        from .accuracy import accuracy_docs
        made += accuracy_docs.write_docs(res["accuracy"], out, into)
    if "scale_accuracy" in res:
        from .accuracy import scale_accuracy_docs
        made += scale_accuracy_docs.write_docs(res["scale_accuracy"], out, into)
    if "private_accuracy" in res and into is not None:
        from .accuracy import private_ridge
        made.append(private_ridge.write_docs(res["private_accuracy"], into))
    if "feature_maps" in res:
        from .accuracy import feature_maps_docs
        made += feature_maps_docs.write_docs(res["feature_maps"], out, into)
    if into is not None:
        from .performance import docs as perf_docs
        if perf_docs.write(res, TABLES, into / "performance.md"):
            made.append(into / "performance.md")
    summary = plots(res, out)
    if to_docs:
        for p in summary:
            shutil.copy(p, docs / f"perf_{p.name}")
    return made + summary


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)} (default: the first {len(DEFAULT_SECTIONS)})")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run in well under a minute or two")
    ap.add_argument("--backends", default="sqlite,postgresql", help="databases for the http, memory and service_scale sections")
    ap.add_argument("--sizes", "--n", default="", help="service_scale: comma-separated record counts (default 1e5,1e6)")
    ap.add_argument("--profile", action="store_true", help="record the service with py-spy during the http section")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--docs", action="store_true",
                    help="copy the summary plots to docs/ and rewrite the sections' generated blocks of "
                         "docs/performance.md")
    ap.add_argument("--server-cpus", default="", help="fairness: CPUs to pin the server to (e.g. 0,1)")
    ap.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                    help="measure nothing: rewrite the docs' generated parts and the plots from a saved results.json")
    a = ap.parse_args(argv)
    if a.render is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        made = render(json.loads(a.render.read_text()), a.out, ROOT / "docs", a.docs)
        print("wrote " + ", ".join(str(p) for p in made))
        return
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    backends = tuple(b.strip() for b in a.backends.split(",") if b.strip())
    a.out.mkdir(parents=True, exist_ok=True)
    from .performance import docs as perf_docs
    res: dict = {"machine": machine(), "quick": a.quick, "sections": sections, "commit": perf_docs.commit()}
    t_start = time.perf_counter()
    for name in sections:
        t0 = time.perf_counter()
        print(f"... {name}", flush=True)
        if name == "engine":
            from .performance import engine
            res["engine"] = engine.run(a.quick)
            print("\n".join(_engine_table(res["engine"])))
        elif name == "http":
            from .performance import ingest
            res["http"] = ingest.run(a.quick, backends, a.profile, a.out)
            print("\n".join(_http_table(res["http"])))
        elif name == "forget":
            from .performance import forget
            res["forget"] = forget.run(a.quick)
            print("\n".join(_forget_table(res["forget"])))
        elif name == "noise":
            from .performance import noise
            res["noise"] = noise.run(a.quick)
            print("\n".join(_noise_table(res["noise"])))
        elif name == "accuracy":
            from .accuracy import accuracy, accuracy_docs
            res["accuracy"] = accuracy.run(a.quick)
            print("\n".join(accuracy.table(res["accuracy"])))
            res["accuracy"]["targets"] = accuracy.targets(res["accuracy"], accuracy_docs.RECOMMENDED)
            for t in res["accuracy"]["targets"]:
                mark = {True: "MET", False: "MISSED", None: "n/a"}[t["met"]]
                print(f"  [{mark:>6}] {t['dataset']}: {t['target']}: measured {t['measured']}, reference {t['reference']}")
            # a full run rewrites the generated part of docs/accuracy.md and docs/accuracy.png; --quick only with --docs
            made_acc = accuracy_docs.write_docs(res["accuracy"], a.out, ROOT / "docs" if a.docs or not a.quick else None)
            print("wrote " + ", ".join(str(p) for p in made_acc))
            _feature_maps(res, a)  # the accuracy section carries the feature maps' table too (issue 39)
        elif name == "feature_maps":  # exact_ridge on public feature maps alone
            _feature_maps(res, a)
        elif name == "replay":
            from .performance import replay
            res["replay"] = replay.run(a.quick)
            print("\n".join(replay.table(res["replay"])))
        elif name == "scale_n":  # engine cost at scale, every family (bench/performance/scale_n.py); --docs: performance.md
            from .performance import scale_n
            res["scale_n"] = scale_n.run(a.quick)
            print("\n".join(scale_n.table(res["scale_n"])))
            if a.docs:
                print(f"wrote {scale_n.write_docs(res['scale_n'])}")
        elif name == "scale_accuracy":
            from .accuracy import scale_accuracy
            _accuracy_docs_section(res, name, a, scale_accuracy.run, scale_accuracy.table, scale_accuracy.write_docs)
        elif name == "membership_power":
            from .accuracy import membership
            _accuracy_docs_section(res, name, a, membership.power, membership.power_table,
                                   membership.power_write_docs)
        elif name in ("ridge_cost", "observer", "private_accuracy"):  # issues 36-39 (exact_ridge)
            import importlib
            mod = importlib.import_module({"ridge_cost": ".performance.ridge_cost", "observer": ".accuracy.observer",
                                           "private_accuracy": ".accuracy.private_ridge"}[name], __package__)
            res[name] = mod.run(a.quick)
            print("\n".join(mod.table(res[name])))
            if name == "private_accuracy" and (a.docs or not a.quick):
                print(f"wrote {mod.write_docs(res[name], ROOT / 'docs')}")
        elif name == "service_scale":  # issue 36 item 6: the service at scale beside the engine
            from .performance import service_scale
            sizes = tuple(int(float(v)) for v in a.sizes.split(",") if v.strip()) or None
            res[name] = service_scale.run(a.quick, backends, sizes)
            print("\n".join(service_scale.table(res[name])))
        elif name == "stream":
            from .performance import stream
            res["stream"] = stream.run(a.quick, backends)
            print("\n".join(stream.table(res["stream"])))
        elif name == "scale":
            from .scale import scale
            res["scale"] = scale.run(a.quick, backends)
            print("\n".join(scale.table(res["scale"])))
        elif name == "fairness":
            from .performance import fairness
            cpus = {int(c) for c in a.server_cpus.split(",") if c.strip()} or None
            res["fairness"] = fairness.run(a.quick, cpus)
            print("\n".join(fairness.table(res["fairness"])))
            from .performance import fairness_shapes  # the request shapes of issue 37 item 1

            res["fairness_shapes"] = fairness_shapes.run(a.quick)
            print("\n".join(fairness_shapes.table(res["fairness_shapes"])))
        elif name == "models":  # bench/scale/models.py: 10^4 models on one PostgreSQL; a full run rewrites its docs part
            from .scale import models
            res["models"] = models.run(a.quick)
            print("\n".join(models.table(res["models"])))
            (a.out / "models.json").write_text(json.dumps(res["models"], indent=2, default=str) + "\n")
            if a.docs or not a.quick:
                print(f"wrote {models.write_docs(res['models'], ROOT / 'docs' / 'performance.md')}")
        elif name == "coldstart":
            from .performance import coldstart
            res["coldstart"] = coldstart.run(a.quick)
            print("\n".join(coldstart.table(res["coldstart"])))
        elif name == "memory":
            from .performance import memory
            res["memory"] = memory.run(a.quick, backends)
            print("\n".join(_memory_table(res["memory"])))
        elif name == "profiles":
            from .performance import ingest, profiles
            url, drop = ingest._pg_database() if "postgresql" in backends else (None, None)
            try:
                res["profiles"] = profiles.run(a.out, url)
            finally:
                if url is not None:
                    drop()
            print("\n".join(_profiles_table(res["profiles"])))
        res.setdefault("section_seconds", {})[name] = time.perf_counter() - t0
        print(flush=True)
    res["targets"] = targets(res)
    print("## Targets")
    for key, t in res["targets"].items():
        mark = {True: "MET", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"  [{mark:>6}] {t['target']}: measured {t['measured']}")
    res["total_seconds"] = time.perf_counter() - t_start
    (a.out / "results.json").write_text(json.dumps(res, indent=2, sort_keys=True, default=str) + "\n")
    # plots and docs from the saved results (its sorted keys): what --render rebuilds from it, byte for byte
    res = json.loads((a.out / "results.json").read_text())
    made = plots(res, a.out)
    print(f"wrote {a.out / 'results.json'}" + "".join(f", {p.name}" for p in made))
    if a.docs:
        for p in made:
            shutil.copy(p, ROOT / "docs" / f"perf_{p.name}")
        written = perf_docs.write(res, TABLES)
        print("docs/performance.md: regenerated " + (", ".join(written) or "nothing (no markers for these sections)"))


if __name__ == "__main__":
    main()
