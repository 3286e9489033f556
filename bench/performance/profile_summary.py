"""Summarise a py-spy ``--format raw`` (collapsed stacks) profile: inclusive share of the busiest frames.

``python -m bench.performance.profile_summary bench/results/profile_service_sqlite.txt [--match app/]``
"""
from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path


def summarise(path: Path, match: str = "", top: int = 30) -> str:
    inclusive: collections.Counter = collections.Counter()
    leaf: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = [re.sub(r" \((.*?):\d+\)$", r" (\1)", f) for f in stack.split(";")]
        if any("idle" in f or "select" in f.split(" ")[0] and "selectors" in f for f in frames[-1:]):
            continue  # the event loop waiting for the next request
        total += n
        for f in set(frames):
            inclusive[f] += n
        leaf[frames[-1]] += n
    rows = [f"busy samples: {total}", "", "inclusive %  frame"]
    for f, n in inclusive.most_common():
        if match in f:
            rows.append(f"{100 * n / total:10.1f}  {f}")
        if len(rows) > top + 3:
            break
    rows += ["", "self %  frame (leaf)"]
    for f, n in leaf.most_common(top):
        rows.append(f"{100 * n / total:6.1f}  {f}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", type=Path)
    ap.add_argument("--match", default="")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    print(summarise(a.path, a.match, a.top))


if __name__ == "__main__":
    main()
