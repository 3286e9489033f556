"""The `olu` CLI and a Python SDK generated from openapi/openapi.json, each driving a live server."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from app.cli import DEMO_ALGORITHM, demo_features
from app.cli import app as cli

from .conftest import ADMIN_TOKEN
from .helpers import create_model, examples, unit_rows, verify_receipt
from .tools import scripts_dir, tool, tool_env

runner = CliRunner()


def test_cli_tenant_and_key_admin(tmp_path, monkeypatch):
    monkeypatch.setenv("OLU_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("OLU_DATABASE_URL", raising=False)
    r = runner.invoke(cli, ["tenant", "create", "acme"])
    assert r.exit_code == 0, r.output
    tenant = json.loads(r.output)
    assert tenant["api_key"].startswith("olu_")
    r = runner.invoke(cli, ["key", "create", tenant["id"], "--scope", "audit", "--label", "auditor"])
    assert r.exit_code == 0, r.output
    key = json.loads(r.output)
    assert key["scopes"] == ["audit"]
    assert runner.invoke(cli, ["key", "create", tenant["id"], "--scope", "root"]).exit_code != 0
    assert runner.invoke(cli, ["key", "revoke", tenant["id"], key["id"]]).exit_code == 0
    assert runner.invoke(cli, ["migrate"]).output.startswith("schema: head")
    r = runner.invoke(cli, ["signing-key", "rotate", "--grace-seconds", "0"])
    assert r.exit_code == 0 and "active key" in r.output


def test_cli_verify_bundle_and_tampering(server, tenant, tmp_path):
    _, c = tenant
    mid = create_model(c, dim=2)["id"]
    c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(5, 2))})
    c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1", "rec-2"]})
    bundle = c.get("/v1/audit/export", params={"model_id": mid}).json()
    (tmp_path / "bundle.json").write_text(json.dumps(bundle))
    (tmp_path / "keys.json").write_text(json.dumps(c.get("/v1/keys").json()))
    r = runner.invoke(cli, ["verify", str(tmp_path / "bundle.json"), "--keys", str(tmp_path / "keys.json")])
    assert r.exit_code == 0 and "verified" in r.output and "FAIL" not in r.output, r.output
    r = runner.invoke(cli, ["verify", str(tmp_path / "bundle.json"), "--server", server.url])
    assert r.exit_code == 0
    bundle["receipts"][1]["learned_step"] += 1
    (tmp_path / "bad.json").write_text(json.dumps(bundle))
    r = runner.invoke(cli, ["verify", str(tmp_path / "bad.json"), "--keys", str(tmp_path / "keys.json")])
    assert r.exit_code == 1 and "FAIL receipt[1].signature" in r.output
    single = c.get(f"/v1/receipts/{bundle['receipts'][0]['id']}").json()
    (tmp_path / "one.json").write_text(json.dumps(single))
    assert runner.invoke(cli, ["verify", str(tmp_path / "one.json"), "--keys", str(tmp_path / "keys.json")]).exit_code == 0


def test_cli_demo_against_a_live_server(server):
    if server.backend != "sqlite":
        pytest.skip("the demo is exercised once, on the SQLite backend")
    r = runner.invoke(cli, ["demo", "--server", server.url, "--admin-token", ADMIN_TOKEN, "--forget", "5"])
    assert r.exit_code == 0, r.output
    assert "held-out accuracy" in r.output and "offline verification of 5 receipts: ok" in r.output
    assert f"({DEMO_ALGORITHM}, loss logistic)" in r.output  # the recommended family by default
    before, after = (float(w) for w in r.output.split("held-out accuracy: ")[1].split(" before, ")[0:1]
                     + [r.output.split(" before, ")[1].split(" after")[0]])
    exact = float(r.output.split("exact retrain on the remaining 450 records: ")[1].split(" ")[0])
    # issue 16: with the demo's preprocessing the model reaches a plain logistic regression's accuracy (0.842
    # before it), and the recommended family stays within 2 points of the exact retrain after forgetting
    assert 0.93 <= before <= 1.0 and 0.93 <= exact <= 1.0
    assert abs(after - exact) <= 0.02, r.output


def test_demo_features_meet_the_declared_bound_with_full_rows():
    import numpy as np

    X = np.random.default_rng(0).normal(3.0, 5.0, size=(50, 4))
    Z = demo_features(X, 40)
    assert np.allclose(np.linalg.norm(Z, axis=1), 1.0)  # every row on the unit sphere: inside ||x|| <= 1, full length
    assert np.allclose(demo_features(np.vstack([X[:40], 1e6 * X[40:]]), 40)[:40], Z[:40])  # test rows do not leak in


@pytest.fixture(scope="module")
def sdk(tmp_path_factory):
    """The Python SDK generated from openapi/openapi.json, imported as ``olu_client``; generation prints no
    warning (every operation and body, the learn body included, is in the client)."""
    exe = tool("openapi-python-client")  # beside sys.executable first: no activated environment needed
    assert exe, f"openapi-python-client is part of the test extra (looked in {scripts_dir()} and on PATH)"
    spec = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"
    root = tmp_path_factory.mktemp("sdk")
    out = subprocess.run([exe, "generate", "--path", str(spec), "--meta", "none", "--output-path",
                          str(root / "olu_client")], capture_output=True, text=True, timeout=300, env=tool_env())
    assert out.returncode == 0, out.stdout + out.stderr
    printed = out.stdout + out.stderr
    assert "warning" not in printed.lower() and "error" not in printed.lower(), printed
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("olu_client")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith("olu_client")]:
            del sys.modules[name]


def _sdk_tenant(sdk, server, name: str):
    from olu_client.api.admin import create_tenant
    from olu_client.models import TenantCreate

    admin = sdk.AuthenticatedClient(base_url=server.url, token=ADMIN_TOKEN)
    tenant = create_tenant.sync(client=admin, body=TenantCreate(name=name))
    return sdk.AuthenticatedClient(base_url=server.url, token=tenant.api_key)


def test_generated_sdk_drives_the_service(server, sdk):
    if server.backend != "sqlite":
        pytest.skip("the SDK is generated and exercised once, on the SQLite backend")
    from olu_client.api.audit import get_receipt
    from olu_client.api.models import create_model as sdk_create_model
    from olu_client.api.models import learn, predict, unlearn
    from olu_client.api.system import list_public_keys
    from olu_client.models import Bounds, Example, LearnRequest, ModelCreate, PredictRequest, UnlearnRequest

    client = _sdk_tenant(sdk, server, "sdk")
    model = sdk_create_model.sync(client=client, body=ModelCreate(name="sdk-model", dim=2, bounds=Bounds(x_norm=1.0)))
    X = unit_rows(8, 2)
    res = learn.sync(model_id=model.id, client=client, body=LearnRequest(
        examples=[Example(id=f"s{i}", x=list(map(float, x)), y=float(i % 2)) for i, x in enumerate(X)]))
    assert res.accepted == 8 and res.last_step == 8
    pred = predict.sync(model_id=model.id, client=client, body=PredictRequest(x=[list(map(float, X[0]))]))
    assert len(pred.predictions) == 1
    forgotten = unlearn.sync(model_id=model.id, client=client, body=UnlearnRequest(ids=["s3"]))
    receipt = get_receipt.sync(receipt_id=forgotten.receipts[0].id, client=client)
    assert receipt.proof.leaf_index == receipt.log_index
    keys = list_public_keys.sync(client=sdk.Client(base_url=server.url))
    as_dict = receipt.to_dict()
    assert verify_receipt(as_dict, [k.to_dict() for k in keys.keys])


# Feature dictionaries through the SDK.  To extend with multi-class labels (issue 16 item 1), add the model's
# loss/classes to MODEL_EXTRA and a label function to LABEL: the rest of the scenario is shared.
FEATURE_SPEC = {"type": "hashed", "dim": 32, "numeric": {"age": [0, 100]}, "categorical": ["country", "tags"]}
TEN_CLASSES = [f"c{k}" for k in range(10)]


def _binary_scores(enc, params):
    return 1 / (1 + np.exp(-(enc @ np.array(params.weights) + params.bias)))


def _softmax_probabilities(enc, params):
    K, width = params.shape
    W = np.array(params.weights).reshape(K, width)
    z = enc @ W[:, :-1].T + W[:, -1]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def _least_squares_scores(enc, params):
    """exact_ridge's classifier: the K outputs and their clip((s + 1) / 2, 0, 1), normalised (README)."""
    K, width = params.shape
    W = np.array(params.weights).reshape(K, width)
    s = enc @ W[:, :-1].T + W[:, -1]
    p = np.clip((s + 1) / 2, 0, 1)
    return s, p / p.sum(axis=1, keepdims=True)


# name -> (extra model fields, label of a row, check of the prediction against the published parameters)
SDK_SCENARIOS = {
    "binary": ({}, lambda row: float(row["age"] > 50),
               lambda pred, enc, params: np.allclose(pred.scores, _binary_scores(enc, params))),
    # a 10-class softmax model with declared class names, over hashed feature dictionaries (issue 16 "done when")
    "ten_classes": ({"loss": "softmax", "classes": TEN_CLASSES}, lambda row: TEN_CLASSES[row["age"] % 10],
                    lambda pred, enc, params: (
                        np.allclose(pred.probabilities, _softmax_probabilities(enc, params))
                        and pred.classes == [TEN_CLASSES[k] for k in
                                             _softmax_probabilities(enc, params).argmax(axis=1)]
                        and params.shape == [10, 33])),
    # a least-squares classifier over integer sums (exact_ridge, issue 30), keeping the data to forget by id
    "least_squares": ({"algorithm": "exact_ridge", "loss": "squared", "classes": TEN_CLASSES[:3],
                       "hyperparameters": {"deletion_features": "retained"}}, lambda row: TEN_CLASSES[row["age"] % 3],
                      lambda pred, enc, params: (
                          np.allclose(pred.probabilities, _least_squares_scores(enc, params)[1])
                          and pred.classes == [TEN_CLASSES[k] for k in
                                               _least_squares_scores(enc, params)[0].argmax(axis=1)]
                          and params.shape == [3, 33])),
}


@pytest.mark.parametrize("scenario", sorted(SDK_SCENARIOS))
def test_generated_sdk_learns_forgets_and_predicts_with_feature_dictionaries(server, sdk, scenario):
    if server.backend != "sqlite":
        pytest.skip("the SDK is generated and exercised once, on the SQLite backend")
    from olu_client.api.models import create_model as sdk_create_model
    from olu_client.api.models import get_model, get_parameters, learn, predict, unlearn
    from olu_client.models import (Bounds, Example, FeatureDict, FeatureSpec, LearnRequest, ModelCreate,
                                   PredictRequest, UnlearnRequest)
    from olu_client.types import Response

    model_extra, label, agrees = SDK_SCENARIOS[scenario]
    client = _sdk_tenant(sdk, server, "sdk-features")
    model = sdk_create_model.sync(client=client, body=ModelCreate.from_dict({
        "name": "sdk-hashed", "dim": 32, "bounds": Bounds(x_norm=2.0).to_dict(),
        "algorithm": "retrain", "features": FeatureSpec.from_dict(FEATURE_SPEC).to_dict(), **model_extra}))
    assert model.features.hash_ == "murmurhash3_x64_128" and model.features.numeric["age"] == [0.0, 100.0]
    rows = [{"age": 20 + 7 * i % 70, "country": ["FR", "DE", "IT"][i % 3], "tags": ["t%d" % (i % 4), "x"]}
            for i in range(20)]
    res = learn.sync(model_id=model.id, client=client, body=LearnRequest(examples=[
        Example(id=f"f{i}", features=FeatureDict.from_dict(row), y=label(row))
        for i, row in enumerate(rows)]))
    assert res.accepted == 20
    forgotten = unlearn.sync(model_id=model.id, client=client, body=UnlearnRequest(ids=["f4", "f9"]))
    assert len(forgotten.receipts) == 2
    assert get_model.sync(model_id=model.id, client=client).n_forgotten == 2
    pred = predict.sync(model_id=model.id, client=client, body=PredictRequest(
        features=[FeatureDict.from_dict(r) for r in rows[:3]]))
    assert len(pred.predictions) == 3 and pred.version == forgotten.version
    # what the SDK sent is what the featurizer encodes: the scores are the published parameters on the encoding
    from app.features import featurize, normalize_spec

    params = get_parameters.sync(model_id=model.id, client=client)
    enc = np.array([featurize(normalize_spec(FEATURE_SPEC, 32), r, 2.0) for r in rows[:3]])
    assert agrees(pred, enc, params)
    # a bad dictionary is a 422 problem through the SDK too, naming the field
    bad: Response = predict.sync_detailed(model_id=model.id, client=client, body=PredictRequest(
        features=[FeatureDict.from_dict({"age": 101})]))
    assert bad.status_code == 422 and json.loads(bad.content)["field"] == "age"
