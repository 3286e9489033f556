"""Hostile input: configured limits answer 413/422, and fuzzed ids and JSON never give a 5xx or change state.

- limits (a dedicated server with small limits): body size (declared and streamed), batch size on learn,
  unlearn and predict, model dimension, record id length (256), Idempotency-Key length;
- hypothesis: arbitrary unicode record ids (control characters, lone surrogates, NUL, RTL marks...) through
  learn, unlearn and the audit path; arbitrary JSON documents, huge numbers and deep nesting as request
  bodies.  Always 2xx or 4xx; after a 4xx the model is unchanged.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import start_server
from .helpers import create_model, examples, unit_rows


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("limits")
    srv, (uv, thread) = start_server(f"sqlite:///{d / 'olu.db'}", d, "sqlite", max_body_bytes=20_000, max_batch=5,
                                     max_dim=50)
    yield srv
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()


def _state(c, mid):
    m = c.get(f"/v1/models/{mid}").json()
    return m["version"], m["step"], m["n_records"], m["n_forgotten"]


def _problem(r, status, slug=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    if slug:
        assert r.json()["type"].endswith("/" + slug), r.text


def test_limits_answer_413_and_422_and_change_nothing(small):
    _, key = small.new_tenant()
    with small.client(key) as c:
        mid = create_model(c, dim=3)["id"]
        assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(5, 3))}).status_code == 200
        before = _state(c, mid)
        # body size: declared Content-Length and a streamed (chunked) body
        big = json.dumps({"examples": [{"id": "a" * 200, "x": [0.1, 0.1, 0.1], "y": 1}] * 100}).encode()
        assert len(big) > 20_000
        _problem(c.post(f"/v1/models/{mid}/learn", content=big, headers={"content-type": "application/json"}),
                 413, "payload-too-large")
        _problem(c.post(f"/v1/models/{mid}/learn", content=iter([big[:10_000], big[10_000:]]),
                        headers={"content-type": "application/json"}), 413, "payload-too-large")
        # batch size
        _problem(c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(6, 3), prefix="b")}),
                 413, "batch-too-large")
        _problem(c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"rec-{i}" for i in range(5)] + ["x"]}),
                 413, "batch-too-large")
        _problem(c.post(f"/v1/models/{mid}/predict", json={"x": [[0.1, 0.1, 0.1]] * 6}), 413, "batch-too-large")
        assert c.post(f"/v1/models/{mid}/predict", json={"x": [[0.1, 0.1, 0.1]] * 5}).status_code == 200
        # dimension
        _problem(c.post("/v1/models", json={"name": "wide", "dim": 51, "bounds": {"x_norm": 1.0}}), 422,
                 "invalid-model-spec")
        assert c.post("/v1/models", json={"name": "ok", "dim": 50, "bounds": {"x_norm": 1.0}}).status_code == 201
        # record id length: 256 is fine, 257 is not (learn, unlearn, audit path)
        _problem(c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "i" * 257, "x": [0.1, 0, 0], "y": 1}]}),
                 422, "validation-error")
        _problem(c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["i" * 257]}), 422, "validation-error")
        _problem(c.get("/v1/audit/records/" + "i" * 257), 422, "validation-error")
        _problem(c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "", "x": [0.1, 0, 0], "y": 1}]}),
                 422, "validation-error")
        # idempotency key length
        _problem(c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-0"]}, headers={"Idempotency-Key": "k" * 256}),
                 422, "validation-error")
        assert _state(c, mid) == before
        assert c.post(f"/v1/models/{mid}/learn",
                      json={"examples": [{"id": "i" * 256, "x": [0.1, 0, 0], "y": 1}]}).status_code == 200
        assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["i" * 256]}).status_code == 200


# ---- fuzzing ----------------------------------------------------------------------------------------------
any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), min_size=0, max_size=300)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         any_text)
json_values = st.recursive(json_scalars, lambda kids: st.one_of(st.lists(kids, max_size=5),
                                                                 st.dictionaries(any_text, kids, max_size=5)),
                           max_leaves=20)
FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large], deadline=None)


@pytest.fixture(scope="module")
def fuzz_model(small):
    _, key = small.new_tenant("fuzz")
    c = small.client(key)
    mid = create_model(c, dim=2)["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(3, 2))}).status_code == 200
    yield c, mid
    c.close()


def _dumps(value) -> bytes:
    return json.dumps(value).encode()  # lone surrogates become \\udXXX escapes: valid JSON, invalid UTF-16


@FUZZ
@given(rid=any_text)
def test_arbitrary_unicode_record_ids(fuzz_model, rid):
    c, mid = fuzz_model
    before = _state(c, mid)
    r = c.post(f"/v1/models/{mid}/learn", content=_dumps({"examples": [{"id": rid, "x": [0.1, 0.2], "y": 1}]}),
               headers={"content-type": "application/json"})
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert _state(c, mid) == before
        return
    if r.status_code == 200:
        a = c.get("/v1/audit/records/{}".format(_quote(rid))) if rid and "/" not in rid else None
        if a is not None:
            assert a.status_code < 500
        u = c.post(f"/v1/models/{mid}/unlearn", content=_dumps({"ids": [rid]}), headers={"content-type": "application/json"})
        assert u.status_code == 200, u.text


def _quote(s: str) -> str:
    from urllib.parse import quote

    return quote(s.encode("utf-8", "surrogatepass"), safe="")


@FUZZ
@given(rid=any_text)
def test_arbitrary_audit_path_ids(fuzz_model, rid):
    c, _ = fuzz_model
    r = c.get("/v1/audit/records/" + _quote(rid))
    assert r.status_code < 500, r.text


@FUZZ
@given(body=json_values, path=st.sampled_from(["learn", "unlearn", "predict", None]))
def test_arbitrary_json_bodies(fuzz_model, body, path):
    c, mid = fuzz_model
    before = _state(c, mid)
    url = f"/v1/models/{mid}/{path}" if path else "/v1/models"
    r = c.post(url, content=_dumps(body), headers={"content-type": "application/json"})
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert _state(c, mid) == before


@FUZZ
@given(number=st.one_of(st.integers(min_value=-(10**400), max_value=10**400).map(str),
                        st.sampled_from(["1e400", "-1e400", "1e-400", "123456789" * 40, "-0", "1E+99999",
                                         "0.0000000000000000000000000000000000001"])),
       where=st.sampled_from(["x", "y", "dim", "limit"]))
def test_huge_numbers(fuzz_model, number, where):
    c, mid = fuzz_model
    before = _state(c, mid)
    if where == "x":
        r = c.post(f"/v1/models/{mid}/learn", content=f'{{"examples":[{{"id":"h","x":[{number},0],"y":1}}]}}',
                   headers={"content-type": "application/json"})
    elif where == "y":
        r = c.post(f"/v1/models/{mid}/predict", content=f'{{"x":[[0.1,{number}]]}}',
                   headers={"content-type": "application/json"})
    elif where == "dim":
        r = c.post("/v1/models", content=f'{{"name":"n","dim":{number},"bounds":{{"x_norm":{number}}}}}',
                   headers={"content-type": "application/json"})
    else:
        r = c.get("/v1/models", params={"limit": number, "cursor": number})
    assert r.status_code < 500, r.text
    if r.status_code >= 400 or where != "x":
        assert _state(c, mid) == before
    elif r.status_code == 200:  # a learned "h" (only for tiny numbers): forget it again
        assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["h"]}).status_code == 200


@pytest.mark.parametrize("depth", [50, 1000, 100_000])
@pytest.mark.parametrize("opener,closer", [("[", "]"), ('{"a":', "}")])
def test_deep_nesting(fuzz_model, depth, opener, closer):
    c, mid = fuzz_model
    before = _state(c, mid)
    body = opener * depth + "1" + closer * depth
    for url in (f"/v1/models/{mid}/learn", f"/v1/models/{mid}/unlearn", "/v1/models"):
        r = c.post(url, content=body, headers={"content-type": "application/json"})
        assert r.status_code in (400, 413, 422), (url, depth, r.status_code, r.text[:200])
        assert r.headers["content-type"].startswith("application/problem+json")
        assert not r.json()["type"].endswith("/error")
    r = c.post(f"/v1/models/{mid}/learn", content='{"examples":[{"id":"n","x":[0.1,0],"y":1,"extra":' + body + "}]}",
               headers={"content-type": "application/json"})
    assert r.status_code in (400, 413, 422)
    assert _state(c, mid) == before


@FUZZ
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes(fuzz_model, raw):
    c, mid = fuzz_model
    before = _state(c, mid)
    r = c.post(f"/v1/models/{mid}/learn", content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert _state(c, mid) == before


def test_regressions_found_by_schemathesis(small):
    """Each of these answered 500 (or served null where the schema says number) before it was fixed."""
    _, key = small.new_tenant("regressions")
    with small.client(key) as c:
        mid = create_model(c, dim=2)["id"]
        assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(3, 2))}).status_code == 200
        before = _state(c, mid)
        # ragged feature rows
        _problem(c.post(f"/v1/models/{mid}/learn", json={"examples": [{"id": "a", "x": [0.1, 0.1], "y": 1},
                                                                       {"id": "b", "x": [], "y": 1}]}),
                 422, "invalid-dimension")
        _problem(c.post(f"/v1/models/{mid}/predict", json={"x": [[0.1, 0.1], [0.1]]}), 422, "invalid-dimension")
        # scores that overflow float64 cannot be served as JSON
        _problem(c.post(f"/v1/models/{mid}/predict", json={"x": [[1.7e308, -1.7e308]]}), 422, "out-of-bounds-input")
        # bounds so large the public constants overflow; a delta whose log(1/delta) is infinite
        _problem(c.post("/v1/models", json={"name": "huge", "dim": 1, "bounds": {"x_norm": 1e308},
                                            "domain_radius": 1e308}), 422, "invalid-model-spec")
        _problem(c.post("/v1/models", json={"name": "huge", "dim": 1, "bounds": {"x_norm": 1.0},
                                            "domain_radius": 1.0e308}), 422, "invalid-model-spec")
        _problem(c.post("/v1/models", json={"name": "tiny", "dim": 1, "bounds": {"x_norm": 1.0},
                                            "privacy": {"epsilon": 1.0, "delta": 5e-324}}), 422, "validation-error")
        # a cursor beyond BIGINT (PostgreSQL would raise) or not a number
        _problem(c.get(f"/v1/models/{mid}/deletions", params={"cursor": "9" * 30}), 422, "validation-error")
        _problem(c.get(f"/v1/models/{mid}/deletions", params={"cursor": "f"}), 422, "validation-error")
        # naive datetimes from SQLite are served as UTC (RFC 3339 needs the offset)
        m = c.get(f"/v1/models/{mid}").json()
        assert m["created_at"].endswith(("Z", "+00:00"))
        assert c.get(f"/v1/models/{mid}/parameters").json()["published_at"].endswith(("Z", "+00:00"))
        # 405 lists every method of the resource
        r = c.request("OPTIONS", f"/v1/models/{mid}")
        assert r.status_code == 405 and {"GET", "DELETE"} <= set(r.headers["allow"].replace(" ", "").split(","))
        assert _state(c, mid) == before
        assert c.get("/v1/models").status_code == 200
