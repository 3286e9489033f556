"""Section ``scale_accuracy``: targets, the printed table, the generated "Accuracy at scale" and "Membership
inference after forgetting" parts of docs/accuracy.md with their plots, and the merge of a partial run into a saved
one (the protocol is bench/accuracy/scale_accuracy.py's docstring)."""
from __future__ import annotations

import json
import math
import time
from typing import Any

from app.unlearning import ALGORITHMS
from app.unlearning.families.sisa import DEFAULT_SLICES

from .scale_runs import MIA_RATE, rate_label

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
                  f"`sisa` with S shards ({DEFAULT_SLICES} slices) learned on bench.accuracy.accuracy's data sets: held-out "
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
             f"with {r['shadows']} shadow models (bench/accuracy/membership.py). ![membership](membership.png)", ""]
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
               "[bench/accuracy/scale_accuracy.py](../bench/accuracy/scale_accuracy.py); `--quick` is a smoke run at 3 000 records that "
               "writes under bench/results/ only).")


def write_docs(r: dict[str, Any], out, docs=None) -> list:
    """Markdown and the plot under ``out``; with ``docs`` also docs/membership.png and the two generated parts of
    docs/accuracy.md (sections "Accuracy at scale" and "Membership inference after forgetting", appended with
    their markers the first time; the prose around the markers is kept)."""
    from pathlib import Path

    from .accuracy_docs import write_generated

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


