"""Discoverable knobs (issue 40 item 4): every family's hyperparameter table (app/unlearning/families/
hyperparameters.py) is what GET /v1/algorithms and the OpenAPI document serve as a JSON Schema, and what the service
checks a new model's hyperparameters against; these tests keep the schema, the table and the families' own checks
in step.

* every family serves exactly the losses it declares, its default loss among them (exact_ridge: squared);
* every family's normalised defaults (each loss it serves) validate against its schema and pass its table;
* a random sample of accepted specs validates against the schema, given and normalised;
* hyperparameters drawn from the schema (moderate numbers) are accepted, or refused naming a field of one of the
  family's declared rules across fields (x-rules), and most are accepted;
* a misspelt knob's 422 lists the accepted names and the closest, which is accepted in its place.
"""
from __future__ import annotations

import math
import random

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.services.spec_hints import accepted, with_default_loss
from app.unlearning import ALGORITHMS, SpecError, check_new_hyperparameters, hyperparameter_schema, hyperparameter_table
from app.registry import build_spec
from app.unlearning.maths.losses import LOSSES

FAMILIES = sorted(ALGORITHMS)
MAX_DIM = 100_000
# knobs a family requires: the smallest values the tests give them
REQUIRED = {"online_dp_tree": {"horizon": 1000, "max_deletions": 10},
            "passive_olu_restart": {"horizon": 1000, "max_deletions": 10}}


def payload(algorithm: str, loss: str | None = None, hp: dict | None = None) -> dict:
    body = {"name": "m", "algorithm": algorithm, "loss": loss, "dim": 3, "bounds": {"x_norm": 1.0, "y_abs": 1.0},
            "domain_radius": 10.0, "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "hyperparameters": {**REQUIRED.get(algorithm, {}), **(hp or {})}}
    if loss == "softmax":
        body["n_classes"] = 3
    return with_default_loss(body)


def validator(algorithm: str) -> jsonschema.Draft202012Validator:
    schema = hyperparameter_schema(algorithm)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("algorithm", FAMILIES)
def test_each_family_serves_exactly_its_declared_losses_and_its_default(algorithm):
    table = hyperparameter_table(algorithm)
    assert table.default_loss in table.losses
    assert payload(algorithm)["loss"] == table.default_loss
    assert accepted(payload(algorithm), max_dim=MAX_DIM)  # no loss given: the default loss, served
    for loss in LOSSES:
        assert accepted(payload(algorithm, loss), max_dim=MAX_DIM) == (loss in table.losses), (algorithm, loss)
    if algorithm == "exact_ridge":
        assert table.default_loss == "squared"


@pytest.mark.parametrize("algorithm", FAMILIES)
def test_normalised_defaults_validate_and_pass_the_table(algorithm):
    v = validator(algorithm)
    for loss in hyperparameter_table(algorithm).losses:
        spec = build_spec(payload(algorithm, loss), max_dim=MAX_DIM)
        hp = dict(spec.hyperparameters)
        errors = [e.message for e in v.iter_errors(hp)]
        assert not errors, (algorithm, loss, hp, errors)
        check_new_hyperparameters(algorithm, loss, hp)  # a model's own hyperparameters make a new model
        # the schema's static defaults are the family's
        for name, prop in hyperparameter_schema(algorithm)["properties"].items():
            if "default" in prop and name in hp and prop.get("description", "").find("Applies only") < 0:
                assert hp[name] == prop["default"], (algorithm, name, hp[name], prop["default"])


def _knob_values(algorithm: str):
    """A strategy for a family's hyperparameters: accepted and refused values of its knobs, and unknown names."""
    table = hyperparameter_table(algorithm)
    per = {}
    for k in table.knobs:
        options = [st.none(), st.booleans(), st.sampled_from(["auto", "x", "shanno_phua"])]
        if k.choices:
            options.append(st.sampled_from(k.choices))
        if k.kind in ("number", "integer"):
            lo = k.minimum if k.minimum is not None else -10.0
            hi = k.maximum if k.maximum is not None else lo + 1e4
            ints = st.integers(int(max(lo, -1e6)) - 1, int(min(hi, 1e6)) + 1)
            options += [ints, st.floats(lo - 1, min(hi, lo + 1e4) + 1, allow_nan=False)] if k.kind == "number" \
                else [ints, ints.map(float)]
        per[k.name] = st.one_of(*options)
    keys = st.lists(st.sampled_from(sorted(per) + ["shard", "learning_rate"]), max_size=3, unique=True)
    return keys.flatmap(lambda ks: st.fixed_dictionaries({k: per.get(k, st.integers(0, 5)) for k in ks}))


@pytest.mark.parametrize("algorithm", FAMILIES)
def test_accepted_specs_validate_against_the_schema(algorithm):
    v = validator(algorithm)
    seen = {"accepted": 0}

    @settings(max_examples=25)
    @given(hp=_knob_values(algorithm), loss=st.sampled_from(hyperparameter_table(algorithm).losses))
    def check(hp, loss):
        body = payload(algorithm, loss, hp)
        if not accepted(body, max_dim=MAX_DIM):
            return
        seen["accepted"] += 1
        given_hp = body["hyperparameters"]
        assert not [e.message for e in v.iter_errors(given_hp)], (algorithm, given_hp)
        normalised = dict(build_spec(body, max_dim=MAX_DIM).hyperparameters)
        assert not [e.message for e in v.iter_errors(normalised)], (algorithm, normalised)

    check()


def _moderate(prop: dict, rng: random.Random):
    """A value of one schema property; a number within its range and within a factor 4 of its default (or within
    20 of its lower end): the schema's ranges are the knobs' own, and a spec whose calibration leaves the finite
    range at its worst case (an omega of 75 at 10^12 deletions) is refused naming the field, by the calibration."""
    alts = prop.get("anyOf", [prop])
    alt = rng.choice([a for a in alts if a.get("type") != "null"] or alts)
    if "enum" in alt:
        return rng.choice(alt["enum"])
    t = alt.get("type")
    if t == "boolean":
        return rng.random() < 0.5
    lo = alt.get("minimum", alt.get("exclusiveMinimum", 0.0))
    hi = alt.get("maximum", alt.get("exclusiveMaximum", math.inf))
    default = prop.get("default")
    if isinstance(default, (int, float)) and not isinstance(default, bool) and default > 0:
        lo, hi = max(lo, default / 4), min(hi, default * 4)
    else:
        hi = min(hi, lo + 20)
    if t == "integer":
        return rng.randint(math.ceil(lo), max(math.ceil(lo), math.floor(hi)))
    x = rng.uniform(lo, hi)
    return x if x not in (alt.get("exclusiveMinimum"), alt.get("exclusiveMaximum")) else (lo + hi) / 2


@pytest.mark.parametrize("algorithm", FAMILIES)
def test_schema_valid_hyperparameters_are_accepted(algorithm):
    """Drawn from the schema alone: accepted, or refused naming a field of one of the family's declared rules."""
    schema = hyperparameter_schema(algorithm)
    v = validator(algorithm)
    table = hyperparameter_table(algorithm)
    rule_fields = {f for r in table.rules for f in r.fields}
    rng = random.Random(f"schema-{algorithm}")
    tried = ok = 0
    while tried < 20:
        names = rng.sample(sorted(schema["properties"]), k=rng.randint(0, min(3, len(schema["properties"]))))
        hp = {**REQUIRED.get(algorithm, {}), **{n: _moderate(schema["properties"][n], rng) for n in names}}
        if not v.is_valid(hp):
            continue
        # a knob for one loss (huber_delta) says so in its description: the loss is outside the object
        losses = [loss for loss in table.losses
                  if all(loss in table.by_name[n].losses for n in hp if table.by_name[n].losses)]
        if not losses:
            continue
        body = payload(algorithm, rng.choice(losses), hp)
        tried += 1
        try:
            check_new_hyperparameters(body["algorithm"], body["loss"], body["hyperparameters"])
            build_spec(body, max_dim=MAX_DIM)
            ok += 1
        except SpecError as e:
            named = set(e.fields) | {getattr(e, "field", None)}
            assert named & rule_fields, (algorithm, hp, str(e), e.fields)
    assert ok >= 10, (algorithm, ok, tried)  # the rules refuse a few, not most


def test_a_misspelt_knob_lists_the_accepted_names_and_the_closest(tenant):
    _, c = tenant
    body = {"name": "m", "algorithm": "sisa", "dim": 3, "bounds": {"x_norm": 1.0}, "hyperparameters": {"shard": 4}}
    r = c.post("/v1/models", json=body)
    assert r.status_code == 422, r.text
    p = r.json()
    err = p["errors"][0]
    assert err["field"] == "hyperparameters.shard" and err["closest"] == "shards"
    assert set(err["accepted"]) == {k.name for k in hyperparameter_table("sisa").knobs}
    assert "did you mean 'shards'" in p["detail"] and "slices" in p["detail"]
    r = c.post("/v1/models", json={**body, "hyperparameters": {err["closest"]: 4}})
    assert r.status_code == 201, r.text
    assert r.json()["hyperparameters"]["shards"] == 4


def test_a_model_without_a_loss_gets_its_familys_default(tenant):
    _, c = tenant
    for algorithm in ("exact_ridge", "passive_olu"):
        r = c.post("/v1/models", json={"name": "m", "algorithm": algorithm, "dim": 3, "bounds": {"x_norm": 1.0}})
        assert r.status_code == 201, r.text
        assert r.json()["loss"] == hyperparameter_table(algorithm).default_loss


def test_algorithms_and_the_openapi_document_carry_the_schemas(tenant):
    _, c = tenant
    items = {a["name"]: a for a in c.get("/v1/algorithms").json()["items"]}
    doc = c.get("/openapi.json").json()
    links = doc["components"]["schemas"]["ModelCreate"]["x-hyperparameters"]
    assert set(items) == set(ALGORITHMS) == set(links)
    for name, a in items.items():
        assert a["losses"] == list(hyperparameter_table(name).losses) and a["default_loss"] in a["losses"]
        assert a["hyperparameters"] == hyperparameter_schema(name)
        ref = links[name]["$ref"].rsplit("/", 1)[1]
        assert doc["components"]["schemas"][ref] == a["hyperparameters"]
        for prop in a["hyperparameters"]["properties"].values():
            assert prop["description"] and ("type" in prop or "anyOf" in prop or "enum" in prop)
