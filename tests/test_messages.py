"""Messages that are true (issue 40 item 5): every hint a refusal gives is tried against what the service accepts.

* a body without a content type, or with one the route does not read, is 415 naming the accepted types;
* a model spec's 422 that gives an accepted range, or accepted values, is accepted at them; one that says no value
  of its field alone would do is refused at each value;
* a quota refusal names the action that frees that quota, and after it the refused request is accepted.
"""
from __future__ import annotations

import json

import pytest

from .helpers import create_model, examples, unit_rows

SPEC = {"name": "m", "algorithm": "passive_olu", "loss": "logistic", "dim": 3, "bounds": {"x_norm": 1.0},
        "domain_radius": 10.0, "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6}}


@pytest.mark.parametrize("headers", [{}, {"content-type": "text/plain"},
                                     {"content-type": "application/x-www-form-urlencoded"}])
def test_a_body_without_a_json_content_type_is_415_naming_the_accepted_types(tenant, server, headers):
    tenant_id, c = tenant
    mid = create_model(c, dim=3)["id"]
    raw = json.dumps
    cases = [("/v1/models", raw(SPEC), ["application/json"]),
             (f"/v1/models/{mid}/learn", raw({"examples": [{"id": "a", "x": [0.1, 0, 0], "y": 1}]}),
              ["application/json", "application/msgpack"]),
             (f"/v1/models/{mid}/unlearn", raw({"ids": ["a"]}), ["application/json"]),
             (f"/v1/models/{mid}/predict", raw({"x": [[0.1, 0, 0]]}), ["application/json"])]
    for path, body, accepted in cases:
        r = c.post(path, content=body.encode(), headers=headers)
        assert r.status_code == 415, (path, r.status_code, r.text)
        p = r.json()
        assert p["type"] == "/problems/unsupported-media-type" and p["title"] == "Unsupported media type"
        assert r.headers["content-type"] == "application/problem+json"
        for media in accepted:
            assert media in p["accepted"] and media in p["detail"], (path, p)
        # what the answer says works
        ok = c.post(path, content=body.encode(), headers={"content-type": "application/json; charset=utf-8"})
        assert ok.status_code != 415, (path, ok.text)
    with server.admin() as a:
        r = a.put(f"/v1/tenants/{tenant_id}/quotas", content=b'{"models": 5}', headers=headers)
        assert r.status_code == 415, r.text
    assert c.post(f"/v1/models/{mid}/retrain").status_code != 415  # no body: no content type needed


# ---- a refused spec's hints --------------------------------------------------------------------------------------
REFUSED = [
    {"algorithm": "exact_ridge", "loss": "logistic"},
    {"algorithm": "memory_pair", "loss": "softmax", "n_classes": 3},
    {"algorithm": "passive_olu", "l2": 0.0},
    {"algorithm": "active_olu", "l2": 0.0},
    {"algorithm": "passive_olu", "hyperparameters": {"schedule": "convex_constant", "eta": 1e6}},
    {"algorithm": "passive_olu", "hyperparameters": {"omega": 0.5}},
    {"algorithm": "active_olu", "hyperparameters": {"omega": 75.0}},
    {"algorithm": "second_order_olu", "loss": "huber"},
    {"algorithm": "rewind_to_delete", "hyperparameters": {"variant": "descend", "projected": True}},
    {"algorithm": "rewind_to_delete", "l2": 0.0, "hyperparameters": {"regime": "strongly_convex"}},
    {"algorithm": "online_dp_tree", "hyperparameters": {"horizon": 10, "max_deletions": 20}},
    {"algorithm": "sisa", "hyperparameters": {"shards": 0}},
    {"algorithm": "memory_pair", "hyperparameters": {"initial_curvature": "shanno_phua"}},
    {"algorithm": "descent_to_delete", "hyperparameters": {"variant": "secret", "selection": "single"}},
    {"algorithm": "passive_olu", "domain_radius": 1e300},
]


def _set(body: dict, field: str, value) -> dict:
    out = json.loads(json.dumps(body))
    node = out
    parts = field.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


@pytest.mark.parametrize("change", REFUSED, ids=lambda d: "-".join(f"{k}" for k in d))
def test_a_refused_specs_hint_is_true(tenant, change):
    _, c = tenant
    body = {**SPEC, **change}
    r = c.post("/v1/models", json=body)
    assert r.status_code == 422, r.text
    p = r.json()
    assert p["type"] == "/problems/invalid-model-spec"
    if not p.get("errors"):
        return
    err = p["errors"][0]
    field = err["field"]
    if "minimum" in err:
        for v in {err["minimum"], err["maximum"]}:
            ok = c.post("/v1/models", json=_set(body, field, v))
            assert ok.status_code == 201, (field, v, ok.text)
        assert f"{field} is accepted in" in p["detail"]
    elif "accepted" in err and "closest" not in err and not field.endswith(tuple(err["accepted"])):
        assert err["accepted"], p
        for v in err["accepted"]:
            ok = c.post("/v1/models", json=_set(body, field, v))
            assert ok.status_code == 201, (field, v, ok.text)
    if "No value of" in p["detail"]:
        assert "each was tried" in p["detail"]


# ---- quota hints -------------------------------------------------------------------------------------------------
def test_each_quota_refusal_names_the_action_that_frees_it(server):
    tenant_id, key = server.new_tenant("quota-hints")
    X = unit_rows(6, 3, seed=2)
    with server.client(key) as c, server.admin() as a:
        assert a.put(f"/v1/tenants/{tenant_id}/quotas", json={"models": 1, "records": 4}).status_code == 200
        first = create_model(c, dim=3)["id"]
        # models: deleting a model frees one (forgetting records would not)
        r = c.post("/v1/models", json=SPEC)
        assert r.status_code == 409 and r.json()["quota"] == "models", r.text
        assert r.json()["freed_by"] == ["DELETE /v1/models/{id}"] and "forget" not in r.json()["detail"].split(
            "Nothing was changed:")[1].split(";")[0]
        assert c.delete(f"/v1/models/{first}").status_code == 204
        mid = create_model(c, dim=3)["id"]
        # records: forgetting frees them
        assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X[:4])}).status_code == 200
        more = {"examples": examples(X[4:5], start=4)}
        r = c.post(f"/v1/models/{mid}/learn", json=more)
        assert r.status_code == 409 and r.json()["quota"] == "records", r.text
        assert "POST /v1/models/{id}/unlearn" in r.json()["freed_by"] and "unlearn" in r.json()["detail"]
        assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}).status_code == 200
        assert c.post(f"/v1/models/{mid}/learn", json=more).status_code == 200
        # bytes: a quota just below what one more model takes; deleting a model frees its bytes
        assert a.put(f"/v1/tenants/{tenant_id}/quotas", json={"models": 0, "records": 0}).status_code == 200
        used = c.get("/v1/tenant").json()["usage"]["bytes"]
        assert a.put(f"/v1/tenants/{tenant_id}/quotas", json={"bytes": used + 10}).status_code == 200
        r = c.post("/v1/models", json=SPEC)
        assert r.status_code == 409 and r.json()["quota"] == "bytes", r.text
        assert r.json()["freed_by"][0] == "DELETE /v1/models/{id}"
        assert c.delete(f"/v1/models/{mid}").status_code == 204
        assert c.post("/v1/models", json=SPEC).status_code == 201
