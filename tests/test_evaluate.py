"""POST /v1/models/{id}/evaluate and GET /v1/models/{id}/evaluation (issue 39 item 5), over HTTP.

evaluate answers exactly what a client counts from predict's answers (correct, accuracy, the confusion matrix, the
log-loss of predict's probabilities, the mean squared error of its values); it learns nothing (the model's version
and counts do not move) and keeps nothing of the examples (a byte scan of the database files), only the figures
of the last evaluation; bad input is refused as for predict.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from .helpers import create_model, examples, unit_rows


def _learned(client, n: int = 120, **overrides) -> tuple[str, np.ndarray]:
    mid = create_model(client, dim=3, **overrides)["id"]
    X = unit_rows(n, 3, seed=4)
    return mid, X


def _predict(client, mid: str, X) -> dict:
    r = client.post(f"/v1/models/{mid}/predict", json={"x": np.asarray(X).tolist()})
    assert r.status_code == 200, r.text
    return r.json()


def test_logistic_figures_equal_the_client_count(tenant):
    _, client = tenant
    mid, X = _learned(client)
    y = (X[:, 0] + 0.3 * X[:, 1] > 0).astype(float)
    ex = [{"id": f"r{i}", "x": x.tolist(), "y": float(t)} for i, (x, t) in enumerate(zip(X, y))]
    assert client.post(f"/v1/models/{mid}/learn", json={"examples": ex}).status_code == 200
    before = client.get(f"/v1/models/{mid}").json()
    test = unit_rows(200, 3, seed=9)
    truth = (test[:, 0] + 0.3 * test[:, 1] > 0).astype(int)
    answer = _predict(client, mid, test)
    pred = np.array(answer["predictions"])
    r = client.post(f"/v1/models/{mid}/evaluate", json={"x": test.tolist(), "y": truth.tolist()})
    assert r.status_code == 200, r.text
    ev = r.json()
    correct = int(np.sum(pred == truth))  # the client's own count
    assert ev["n"] == 200 and ev["correct"] == correct and ev["accuracy"] == correct / 200
    assert 0 < correct < 200 or correct == 200
    cm = np.array(ev["confusion_matrix"])
    assert cm.shape == (2, 2) and cm.sum() == 200 and np.trace(cm) == correct
    assert cm[1, 0] == int(np.sum((truth == 1) & (pred == 0)))
    p1 = np.array(answer["scores"])
    expected = float(np.mean(-np.log(np.clip(np.where(truth == 1, p1, 1 - p1), 1e-15, 1))))
    assert ev["log_loss"] == pytest.approx(expected, rel=1e-12)
    assert "mean_squared_error" not in ev and ev["version"] == answer["version"]
    after = client.get(f"/v1/models/{mid}").json()  # it learned nothing
    assert (after["version"], after["n_records"], after["step"]) == (before["version"], before["n_records"],
                                                                     before["step"])
    last = client.get(f"/v1/models/{mid}/evaluation").json()["evaluation"]
    assert last == ev


def test_softmax_with_class_names_and_least_squares_classes(tenant):
    _, client = tenant
    X = unit_rows(150, 3, seed=2)
    truth = np.digitize(X[:, 0], [-0.3, 0.3])
    names = ["lo", "mid", "hi"]
    for body in ({"loss": "softmax", "classes": names},
                 {"algorithm": "exact_ridge", "loss": "squared", "classes": names, "l2": 0.01}):
        mid = create_model(client, dim=3, **body)["id"]
        ex = [{"id": f"r{i}", "x": x.tolist(), "y": names[t]} for i, (x, t) in enumerate(zip(X, truth))]
        r = client.post(f"/v1/models/{mid}/learn", json={"examples": ex} if body["loss"] == "softmax" else {
            "examples": ex})
        assert r.status_code == 200, r.text
        answer = _predict(client, mid, X)
        r = client.post(f"/v1/models/{mid}/evaluate", json={"x": X.tolist(), "y": [names[t] for t in truth]})
        assert r.status_code == 200, r.text
        ev = r.json()
        pred = np.array(answer["predictions"])
        assert ev["correct"] == int(np.sum(pred == truth)) and ev["classes"] == names
        assert np.array(ev["confusion_matrix"]).sum() == 150
        if body["loss"] == "softmax":
            P = np.array(answer["probabilities"])
            assert ev["log_loss"] == pytest.approx(float(np.mean(-np.log(np.clip(P[np.arange(150), truth], 1e-15, 1)))))
        else:  # a least-squares classifier's scores are no probabilities
            assert "log_loss" not in ev
        # the same labels as indices give the same figures
        again = client.post(f"/v1/models/{mid}/evaluate", json={"x": X.tolist(), "y": truth.tolist()}).json()
        assert again["correct"] == ev["correct"]


def test_regression_mean_squared_error(tenant):
    _, client = tenant
    mid = create_model(client, dim=3, algorithm="exact_ridge", loss="squared", l2=0.1)["id"]
    X = unit_rows(80, 3, seed=5)
    y = np.clip(X @ np.array([0.5, -0.2, 0.1]), -1, 1)
    ex = [{"id": f"r{i}", "x": x.tolist(), "y": float(t)} for i, (x, t) in enumerate(zip(X, y))]
    assert client.post(f"/v1/models/{mid}/learn", json={"examples": ex}).status_code == 200
    truth = y * 3.0  # labels beyond y_abs are fine to evaluate against
    pred = np.array(_predict(client, mid, X)["predictions"])
    ev = client.post(f"/v1/models/{mid}/evaluate", json={"x": X.tolist(), "y": truth.tolist()}).json()
    assert ev["mean_squared_error"] == pytest.approx(float(np.mean((pred - truth) ** 2)), rel=1e-12)
    assert "accuracy" not in ev and "confusion_matrix" not in ev


def test_bad_input_as_for_predict(tenant, server):
    tenant_id, client = tenant
    mid = create_model(client, dim=3)["id"]
    assert client.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(4, 3))}).status_code == 200
    cases = [
        ({"x": [[0.1, 0.2]], "y": [1]}, 422, "invalid-dimension"),
        ({"x": [[0.1, 0.2, 0.3]], "y": [2]}, 422, "invalid-label"),
        ({"x": [[0.1, 0.2, 0.3]], "y": ["cat"]}, 422, "invalid-label"),
        ({"x": [[0.1, 0.2, 0.3]], "y": [1, 0]}, 422, "validation-error"),
        ({"features": [{"a": 1}], "y": [1]}, 422, "features-not-declared"),
        ({"x": [[0.1, 0.2, 0.3]]}, 422, "validation-error"),
        ({"x": [[1e308, 1e308, 1e308]], "y": [1]}, 422, "out-of-bounds-input"),
    ]
    for body, status, kind in cases:
        r = client.post(f"/v1/models/{mid}/evaluate", json=body)
        assert r.status_code == status and r.json()["type"].endswith(kind), (body, r.text)
    r = client.post("/v1/models/mdl_00000000000000000000000000000000/evaluate", json={"x": [[0, 0, 0]], "y": [1]})
    assert r.status_code == 404
    assert client.get(f"/v1/models/{mid}/evaluation").json() == {"evaluation": None}  # none was answered
    with server.admin() as admin:  # a predict-only key evaluates; an audit-only key does not
        keys = {s: admin.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": [s]}).json()["api_key"]
                for s in ("predict", "audit")}
    with server.client(keys["predict"]) as c:
        assert c.post(f"/v1/models/{mid}/evaluate", json={"x": [[0.1, 0, 0]], "y": [1]}).status_code == 200
    with server.client(keys["audit"]) as c:
        assert c.post(f"/v1/models/{mid}/evaluate", json={"x": [[0.1, 0, 0]], "y": [1]}).status_code == 403
        assert c.get(f"/v1/models/{mid}/evaluation").status_code == 200


def test_nothing_of_the_examples_is_kept(tenant, server):
    """Distinctive feature values and labels sent to evaluate appear in no file of the service (database, WAL);
    the figures go with the model when it is deleted."""
    _, client = tenant
    mid = create_model(client, dim=3, loss="squared", algorithm="exact_ridge", l2=0.1)["id"]
    assert client.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(4, 3))}).status_code == 200
    marks = [0.1234567890123457, -0.3141592653589731, 0.2718281828459041]
    label = 0.8675309000000123
    r = client.post(f"/v1/models/{mid}/evaluate", json={"x": [marks], "y": [label]})
    assert r.status_code == 200, r.text
    if server.backend == "sqlite":
        blobs = b"".join(p.read_bytes() for p in Path(server.data_dir).rglob("*") if p.is_file())
        for v in marks + [label]:
            assert struct.pack("<d", v) not in blobs and repr(v).encode() not in blobs
    assert client.delete(f"/v1/models/{mid}").status_code == 204
    assert client.get(f"/v1/models/{mid}/evaluation").status_code == 404
    assert math.isfinite(r.json()["mean_squared_error"])


def test_olu_evaluate_reads_a_csv_and_combines_requests_exactly(server, tmp_path):
    """`olu evaluate MODEL FILE.csv`: the figures of the whole file, sent in several requests, equal one request's."""
    from typer.testing import CliRunner

    from app.cli import app

    tenant_id, key = server.new_tenant()
    with server.client(key) as client:
        mid = create_model(client, dim=3, loss="softmax", classes=["a", "b", "c"])["id"]
        X = unit_rows(90, 3, seed=8)
        truth = np.digitize(X[:, 1], [-0.3, 0.3])
        ex = [{"id": f"r{i}", "x": x.tolist(), "y": int(t)} for i, (x, t) in enumerate(zip(X, truth))]
        assert client.post(f"/v1/models/{mid}/learn", json={"examples": ex}).status_code == 200
        whole = client.post(f"/v1/models/{mid}/evaluate", json={"x": X.tolist(), "y": truth.tolist()}).json()
    csv_file = tmp_path / "test.csv"
    csv_file.write_text("f0,f1,f2,label\n" + "".join(f"{float(x[0])!r},{float(x[1])!r},{float(x[2])!r},{'abc'[t]}\n"
                                                      for x, t in zip(X, truth)))
    out = CliRunner().invoke(app, ["evaluate", mid, str(csv_file), "--label", "label", "--server", server.url,
                                   "--api-key", key, "--batch", "40"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["requests"] == 3 and got["n"] == 90 and got["correct"] == whole["correct"]
    assert got["confusion_matrix"] == whole["confusion_matrix"] and got["classes"] == ["a", "b", "c"]
    assert got["log_loss"] == pytest.approx(whole["log_loss"], rel=1e-12)
    bad = CliRunner().invoke(app, ["evaluate", mid, str(csv_file), "--server", server.url, "--api-key", key])
    assert bad.exit_code != 0  # no column "y"
