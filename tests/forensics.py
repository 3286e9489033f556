"""Forensic byte scans: is any encoding of an example left in any file of a directory?

Reusable by every test that promises a forgotten record leaves no byte behind (unlearn, model deletion, tenant
deletion): build the needles of each forgotten example with ``needles_of`` and ``scan`` the data directory (the
database, its ``-wal``/``-shm``/journal files, key files, anything else written there) and any log file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import numpy as np


def needles_of(x, y: float | None = None, record_id: str | None = None) -> dict[str, bytes]:
    """Byte patterns of one example: its features as little-endian float64 (each one, and the whole vector), as
    float32 (the vector and every adjacent pair: a single float32 is 4 bytes, which random ciphertext of a few
    megabytes contains by chance), as decimal text (JSON, logs); the label (float64, float32, text) when given and
    distinctive, and the raw record id (UTF-8)."""
    x = np.asarray(x, dtype=np.float64)
    out: dict[str, bytes] = {"x<f8": x.astype("<f8").tobytes(), "x<f4": x.astype("<f4").tobytes()}
    for j, v in enumerate(x):
        out[f"x[{j}]<f8"] = np.float64(v).astype("<f8").tobytes()
        out[f"x[{j}] text"] = repr(float(v)).encode()
        if j + 1 < len(x):
            out[f"x[{j}:{j + 2}]<f4"] = x[j : j + 2].astype("<f4").tobytes()
    if y is not None:
        out["y<f8"] = np.float64(y).astype("<f8").tobytes()
        out["y<f4 with x<f4"] = np.append(x, y).astype("<f4").tobytes()[-8:]
        out["y text"] = repr(float(y)).encode()
    if record_id is not None:
        out["id"] = record_id.encode()
    return out


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.is_file())


def scan(paths: Iterable[Path], needles: Mapping[str, bytes]) -> list[tuple[str, str, int]]:
    """Every (file, needle name, offset) found; [] when no file holds any needle.  Directories are walked."""
    hits = []
    for root in paths:
        root = Path(root)
        for f in files_under(root) if root.is_dir() else [root] if root.exists() else []:
            data = f.read_bytes()
            for name, needle in needles.items():
                at = data.find(needle)
                if at >= 0:
                    hits.append((str(f), name, at))
    return hits
