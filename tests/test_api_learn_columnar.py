"""The columnar learn body ({ids, x, y}, JSON or msgpack) learns exactly what the per-example body learns, and bad
input gets the same problem answers in both shapes (and changes nothing)."""
from __future__ import annotations

import numpy as np
import pytest

from .helpers import create_model, examples, unit_rows

try:
    import msgpack
except ImportError:  # pragma: no cover - msgpack is in the extra "fast"
    msgpack = None
needs_msgpack = pytest.mark.skipif(msgpack is None, reason="msgpack (extra 'fast') is not installed")


def columnar(X: np.ndarray, prefix: str = "rec", start: int = 0) -> dict:
    return {"ids": [f"{prefix}-{start + i}" for i in range(len(X))], "x": X.tolist(),
            "y": [float(i % 2) for i in range(len(X))]}


def _params(c, mid):
    p = c.get(f"/v1/models/{mid}/parameters").json()
    return p["weights"] + [p["bias"]]


@needs_msgpack
def test_both_shapes_and_msgpack_learn_the_same_model(tenant):
    _, c = tenant
    X = unit_rows(40, 5, seed=3)
    mids = [create_model(c, dim=5)["id"] for _ in range(4)]
    answers = [
        c.post(f"/v1/models/{mids[0]}/learn", json={"examples": examples(X)}),
        c.post(f"/v1/models/{mids[1]}/learn", json=columnar(X)),
        c.post(f"/v1/models/{mids[2]}/learn", content=msgpack.packb(columnar(X)),
               headers={"content-type": "application/msgpack"}),
        c.post(f"/v1/models/{mids[3]}/learn", content=msgpack.packb(
            {**columnar(X), "x": np.ascontiguousarray(X, "<f8").tobytes(),
             "y": np.asarray(columnar(X)["y"], "<f8").tobytes()}), headers={"content-type": "application/msgpack"}),
    ]
    for r in answers:
        assert r.status_code == 200, r.text
        assert (r.json()["accepted"], r.json()["first_step"], r.json()["last_step"]) == (40, 1, 40)
    reference = _params(c, mids[0])
    for mid in mids[1:]:
        assert _params(c, mid) == reference  # bitwise: the same floats reach the same engine
    # records learned in columnar form are ordinary records: they can be forgotten by id
    r = c.post(f"/v1/models/{mids[1]}/unlearn", json={"ids": ["rec-7"]})
    assert r.status_code == 200 and r.json()["receipts"][0]["learned_step"] == 8


@pytest.fixture
def model(tenant):
    _, c = tenant
    mid = create_model(c, dim=3, bounds={"x_norm": 1.0, "y_abs": 1.0})["id"]
    assert c.post(f"/v1/models/{mid}/learn", json=columnar(unit_rows(5, 3))).status_code == 200
    return c, mid


def _state(c, mid):
    m = c.get(f"/v1/models/{mid}").json()
    return m["version"], m["step"], m["n_records"], _params(c, mid)


OK_ROW = [0.1, 0.1, 0.1]
BAD_COLUMNAR = [
    ("wrong dimension", {"ids": ["n1"], "x": [[0.1, 0.2]], "y": [1]}, 422, "invalid-dimension"),
    ("ragged rows", {"ids": ["n1", "n2"], "x": [OK_ROW, [0.1, 0.2]], "y": [1, 0]}, 422, "invalid-dimension"),
    ("norm above bound", {"ids": ["n1"], "x": [[0.9, 0.9, 0.9]], "y": [1]}, 422, "out-of-bounds-input"),
    ("label not 0/1", {"ids": ["n1"], "x": [OK_ROW], "y": [0.5]}, 422, "out-of-bounds-input"),
    ("NaN feature (raw JSON)", b'{"ids":["n1"],"x":[[NaN,0.1,0.1]],"y":[1]}', 422, "validation-error"),
    ("Infinity label (raw JSON)", b'{"ids":["n1"],"x":[[0.1,0.1,0.1]],"y":[Infinity]}', 422, "validation-error"),
    ("huge number", b'{"ids":["n1"],"x":[[1e999,0.1,0.1]],"y":[1]}', 422, "validation-error"),
    ("NaN feature (msgpack)", ("mp", {"ids": ["n1"], "x": [[float("nan"), 0.1, 0.1]], "y": [1]}), 422,
     "validation-error"),
    ("inf label (msgpack bytes)", ("mp", {"ids": ["n1"], "x": np.array([OK_ROW]).tobytes(),
                                         "y": np.array([np.inf]).tobytes()}), 422, "validation-error"),
    ("bad raw length (msgpack)", ("mp", {"ids": ["n1", "n2"], "x": np.zeros(3).tobytes(), "y": [1, 0]}), 422,
     "validation-error"),
    ("undecodable msgpack", ("raw-mp", b"\xc1\xc1"), 422, "validation-error"),
    ("empty batch", {"ids": [], "x": [], "y": []}, 422, "validation-error"),
    ("missing labels", {"ids": ["n1"], "x": [OK_ROW]}, 422, "validation-error"),
    ("fewer labels than ids", {"ids": ["n1", "n2"], "x": [OK_ROW, OK_ROW], "y": [1]}, 422, "validation-error"),
    ("fewer rows than ids", {"ids": ["n1", "n2"], "x": [OK_ROW], "y": [1, 0]}, 422, "validation-error"),
    ("flat x", {"ids": ["n1"], "x": OK_ROW, "y": [1]}, 422, "validation-error"),
    ("text feature", {"ids": ["n1"], "x": [["a", 0.1, 0.1]], "y": [1]}, 422, "validation-error"),
    ("null feature", {"ids": ["n1"], "x": [[None, 0.1, 0.1]], "y": [1]}, 422, "validation-error"),
    ("unknown field", {"ids": ["n1"], "x": [OK_ROW], "y": [1], "z": 3}, 422, "validation-error"),
    ("id not a string", {"ids": [17], "x": [OK_ROW], "y": [1]}, 422, "validation-error"),
    ("id too long", {"ids": ["x" * 257], "x": [OK_ROW], "y": [1]}, 422, "validation-error"),
    ("empty id", {"ids": [""], "x": [OK_ROW], "y": [1]}, 422, "validation-error"),
    ("duplicate id in batch", {"ids": ["d", "d"], "x": [OK_ROW, OK_ROW], "y": [1, 0]}, 422, "duplicate-record"),
    ("id already learned", {"ids": ["new", "rec-1"], "x": [OK_ROW, OK_ROW], "y": [1, 0]}, 409, "duplicate-record"),
    ("one bad example spoils the batch", {"ids": ["ok", "bad"], "x": [OK_ROW, [2.0, 0, 0]], "y": [1, 1]}, 422,
     "out-of-bounds-input"),
    ("batch too large", {"ids": [f"b{i}" for i in range(10_001)], "x": [OK_ROW] * 10_001, "y": [1] * 10_001}, 413,
     "batch-too-large"),
]


@pytest.mark.parametrize("name,body,status,slug", BAD_COLUMNAR, ids=[b[0] for b in BAD_COLUMNAR])
def test_bad_columnar_learn_changes_nothing(model, name, body, status, slug):
    c, mid = model
    before = _state(c, mid)
    url = f"/v1/models/{mid}/learn"
    if isinstance(body, bytes):
        r = c.post(url, content=body, headers={"content-type": "application/json"})
    elif isinstance(body, tuple):
        if msgpack is None:
            pytest.skip("msgpack (extra 'fast') is not installed")
        kind, payload = body
        raw = payload if kind == "raw-mp" else msgpack.packb(payload)
        r = c.post(url, content=raw, headers={"content-type": "application/msgpack"})
    else:
        r = c.post(url, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["type"].endswith("/" + slug) and problem["status"] == status and problem["title"], problem
    assert _state(c, mid) == before


def test_ragged_rows_in_the_per_example_shape_are_a_dimension_error(model):
    c, mid = model
    before = _state(c, mid)
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "a", "x": OK_ROW, "y": 1},
                                                             {"id": "b", "x": [0.1, 0.2], "y": 0}]})
    assert r.status_code == 422 and r.json()["type"].endswith("/invalid-dimension"), r.text
    assert _state(c, mid) == before


def test_idempotent_retry_in_the_other_shape_replays(model):
    c, mid = model
    X = unit_rows(3, 3, seed=9)
    headers = {"Idempotency-Key": "cols-1"}
    first = c.post(f"/v1/models/{mid}/learn", json=columnar(X, prefix="idem"), headers=headers)
    assert first.status_code == 200, first.text
    again = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X, prefix="idem")}, headers=headers)
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers.get("idempotent-replayed") == "true"
    other = c.post(f"/v1/models/{mid}/learn", json=columnar(X, prefix="other"), headers=headers)
    assert other.status_code == 422 and other.json()["type"].endswith("/idempotency-key-reused")


# ---- the byte-level shortcut of the strict-number check (app/api/learn_body.py) --------------------------------
@pytest.mark.parametrize("ids,x,y,ok", [
    (["a", "b"], [[0.1, 1e-05], [2, -3.5e+2]], [1, 0.5], True),           # numbers only: the shortcut accepts
    (["a", "b"], [[0.1, True], [0.2, 0.3]], [1, 0], False),               # a boolean in x
    (["a", "b"], [[0.1, 0.2], [0.2, 0.3]], [False, 0], False),            # a boolean in y
    (["a", "b"], [[0.1, "0.2"], [0.2, 0.3]], [1, 0], False),              # a numeric string in x
    (["true", "false"], [[0.1, 0.2], [0.2, 0.3]], [1, 0], True),          # literals inside ids: the per-leaf check
    (["true", "x\"y"], [[0.1, False], [0.2, 0.3]], [1, 0], False),        # ... which still finds the boolean
    (["a", "b"], [[0.1, None], [0.2, 0.3]], [1, 0], False),               # null
])
def test_strict_numbers_in_columnar_json(ids, x, y, ok):
    import orjson
    from fastapi.exceptions import RequestValidationError

    from app.api.learn_body import parse_learn_body

    raw = orjson.dumps({"ids": ids, "x": x, "y": y})
    if ok:
        batch = parse_learn_body(raw, "application/json")
        assert batch.X.shape == (2, 2)
    else:
        with pytest.raises(RequestValidationError):
            parse_learn_body(raw, "application/json")
