"""Forgetting stays total with feature dictionaries: the raw dictionary is stored nowhere (not in retained examples,
record lookups, idempotency journals or logs of the data directory), and once unlearn has answered no file of the
data directory holds the dense encoding either (byte scans of tests/forensics.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from app.features import featurize, normalize_spec

from .forensics import scan
from .test_forgetting_total import _retained_steps, _sqlite_server, _stop

DIM = 16
X_NORM = 2.0
SPEC = {"type": "hashed", "dim": DIM, "numeric": {"age": [0, 120], "score": [-10, 10]},
        "categorical": ["country", "tags"]}
N = 10
AT = 4
COMMON = {0.0, 1.0, -1.0}


def _dense_needles(x: np.ndarray) -> dict[str, bytes]:
    """The dense encoding's byte patterns that random files cannot hold by chance: the whole vector (float64 and
    float32), every entry other than 0 and +-1 as float64 and decimal text (0 and 1 are in every database)."""
    out = {"x<f8": x.astype("<f8").tobytes(), "x<f4": x.astype("<f4").tobytes()}
    for j, v in enumerate(x):
        if float(v) not in COMMON:
            out[f"x[{j}]<f8"] = np.float64(v).astype("<f8").tobytes()
            out[f"x[{j}] text"] = repr(float(v)).encode()
    return out


def _rows(secret: str) -> list[dict]:
    rng = np.random.default_rng(3)
    rows = [{"age": float(rng.uniform(0, 120)), "score": float(rng.uniform(-10, 10)),
             "country": ["FR", "DE", "IT"][i % 3], "tags": ["a", "b"][: i % 3]} for i in range(N)]
    # the forgotten example: a unique category string and distinctive numbers
    rows[AT] = {"age": 31.41592653589793, "score": -2.718281828459045, "country": secret,
                "tags": [secret + "-tag", "a"]}
    return rows


@pytest.mark.parametrize("algorithm,hp", [("retrain", {}), ("active_olu", {}), ("sisa", {"shards": 3}),
                                          ("memory_pair", {"deletion_features": "client"})])
def test_hashed_model_leaves_no_byte_of_the_dictionary_or_its_encoding(tmp_path, algorithm, hp):
    srv, handle = _sqlite_server(tmp_path)
    try:
        _, key = srv.new_tenant()
        with srv.client(key) as c:
            r = c.post("/v1/models", json={"name": "h", "algorithm": algorithm, "loss": "logistic", "dim": DIM,
                                           "bounds": {"x_norm": X_NORM}, "domain_radius": 10.0, "l2": 0.05,
                                           "hyperparameters": hp, "features": SPEC})
            assert r.status_code == 201, r.text
            mid = r.json()["id"]
            secret = f"category-{os.urandom(8).hex()}"
            rows = _rows(secret)
            y = [float(i % 2) for i in range(N)]
            ids = [f"keep-{i}" for i in range(N)]
            ids[AT] = f"forget-me-{os.urandom(6).hex()}"
            body = {"examples": [{"id": rid, "features": row, "y": v} for rid, row, v in zip(ids, rows, y)]}
            # with an Idempotency-Key: the journal keeps the request's hash and the answer, never the body
            r = c.post(f"/v1/models/{mid}/learn", json=body, headers={"Idempotency-Key": "learn-1"})
            assert r.status_code == 200, r.text
            assert c.post(f"/v1/models/{mid}/predict", json={"features": [rows[AT]]}).status_code == 200
            x = featurize(normalize_spec(SPEC, DIM), rows[AT], X_NORM)
            assert np.linalg.norm(x) <= X_NORM and len([v for v in x if float(v) not in COMMON]) >= 2
            raw = {"secret": secret.encode(), "secret tag": (secret + "-tag").encode(),
                   "age text": b"31.41592653589793", "score text": b"-2.718281828459045",
                   "age<f8": np.float64(31.41592653589793).tobytes()}
            # the raw dictionary is stored nowhere, even before forgetting
            assert scan([srv.data_dir], raw) == []
            if algorithm != "memory_pair":
                assert AT + 1 in _retained_steps(srv.data_dir / "olu.db", mid)  # control: the example is held
            unlearn: dict = {"ids": [ids[AT]]}
            if algorithm == "memory_pair":
                unlearn["examples"] = [{"id": ids[AT], "features": rows[AT], "y": y[AT]}]
            r = c.post(f"/v1/models/{mid}/unlearn", json=unlearn, headers={"Idempotency-Key": "forget-1"})
            assert r.status_code == 200, r.text
            hits = scan([srv.data_dir], {**raw, **_dense_needles(x), "id": ids[AT].encode()})
            assert hits == [], hits
            assert AT + 1 not in _retained_steps(srv.data_dir / "olu.db", mid)
            # the model still works on the others
            other = {"ids": [ids[AT + 1]]}
            if algorithm == "memory_pair":
                other["examples"] = [{"id": ids[AT + 1], "features": rows[AT + 1], "y": y[AT + 1]}]
            assert c.post(f"/v1/models/{mid}/unlearn", json=other).status_code == 200
        # control: the scan does see these needles where they are
        (srv.data_dir / "control.bin").write_bytes(x.astype("<f8").tobytes() + secret.encode())
        found = {name for _, name, _ in scan([srv.data_dir], {**raw, **_dense_needles(x)})}
        assert {"x<f8", "secret"} <= found
    finally:
        _stop(handle, srv)
