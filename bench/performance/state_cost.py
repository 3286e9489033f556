"""What an exact_ridge state of D = 1 025 (1 024 feature-map centres; 8 MiB of int64 sums) costs each write today
(issue 39 item 2): ``python -m bench.performance.state_cost``.

A forget stores the whole state blob (A as its upper triangle, ``stored_state``): ``registry.dump`` (pack the arrays,
seal them with AES-GCM) and one UPDATE of the ``model_states`` row, committed with SQLite's synchronous=FULL (fsync),
in the service's own code.
Printed beside the engine's own work for one record (the integer sums' update and the LU solve), medians of
``REPEATS``.  One-off probe, not a section; the machine and its load decide the figures.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

REPEATS = 9


def _median(fn) -> float:
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(centres: int = 1024) -> dict[str, float]:
    from app.crypto import Cipher
    from app.db.session import Database
    from app.db.state_codec import pack_state
    from app.registry import ModelRegistry, build_spec
    from app.unlearning import ArrayRetained

    payload = {"name": "s", "algorithm": "exact_ridge", "loss": "squared", "dim": centres, "n_classes": 26,
               "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 1e-3,
               "privacy": {"epsilon": 1.0, "delta": 1e-6}}
    spec = build_spec(payload, max_dim=100_000)
    reg = ModelRegistry(cipher=Cipher(bytes(range(32))))  # sealed at rest, as a deployment with OLU_ENCRYPTION_KEY
    engine = reg.new_engine(spec)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, centres))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = rng.integers(0, 26, 200).astype(float)
    engine.learn(X, y)
    blob = reg.dump(engine, "mdl_probe")
    out = {"state_bytes": float(len(blob))}
    out["whole_bytes"] = float(len(pack_state(engine.state())))
    out["pack_s"] = _median(lambda: pack_state(engine.state()))
    out["pack_stored_s"] = _median(lambda: pack_state(engine.stored_state()))  # A's upper triangle (what is stored)
    out["dump_s"] = _median(lambda: reg.dump(engine, "mdl_probe"))
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{Path(tmp) / 'probe.db'}")  # the service's engine: WAL, synchronous=FULL
        with db.write() as s:  # model_states' shape without its foreign key
            s.connection().exec_driver_sql("CREATE TABLE probe (model_id TEXT PRIMARY KEY, version INTEGER, blob BLOB)")
            s.connection().exec_driver_sql("INSERT INTO probe VALUES ('mdl_probe', 1, ?)", (blob,))

        def write():
            with db.write() as s:
                s.connection().exec_driver_sql("UPDATE probe SET version = version + 1, blob = ? WHERE model_id = "
                                               "'mdl_probe'", (blob,))

        out["sqlite_write_s"] = _median(write)
        db.dispose()

    def forget_one():
        engine.forget([1], ArrayRetained([1], X[:1], y[:1]))
        engine.learn(X[:1], y[:1])  # back (a new step); the sums change, the published weights are recomputed
        engine.published()

    out["engine_forget_learn_and_solve_s"] = _median(forget_one)
    return out


if __name__ == "__main__":
    r = main()
    mib = r["whole_bytes"] / 2**20
    print(f"exact_ridge state at D = 1 025, 26 classes: {mib:.1f} MiB whole, {r['state_bytes'] / 2**20:.1f} MiB "
          "stored (A's upper triangle, sealed)")
    print(f"  pack_state whole {1e3 * r['pack_s']:.1f} ms, stored form {1e3 * r['pack_stored_s']:.1f} ms, "
          f"dump (pack + seal) {1e3 * r['dump_s']:.1f} ms, "
          f"SQLite UPDATE + commit (synchronous=FULL) {1e3 * r['sqlite_write_s']:.1f} ms")
    print(f"  beside the engine: forget 1 + learn 1 + solve {1e3 * r['engine_forget_learn_and_solve_s']:.1f} ms")
