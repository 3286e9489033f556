"""The request rules the service enforces that a field's own type cannot state, written as JSON Schema (issue 21).

Each fragment here goes into the OpenAPI document through a model's ``json_schema_extra`` (app/schemas/), so
that the document states every rule the handlers enforce on a request's *shape*; a generated SDK and a schema fuzzer
then know them.  What JSON Schema cannot say (a rule across query parameters, lengths that must agree, anything that
depends on the model, the tenant's log or the deployment's limits) is written in the operation descriptions
(app/api/models.py, app/api/audit.py) and answered with a problem type of its own.  The Idempotency-Key header's
pattern is the idempotency store's own (app/services/idempotency.py), stated on the header parameter.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, Strict


# ---- integers ------------------------------------------------------------------------------------------------
def _integral(v: Any) -> Any:
    """JSON Schema's ``integer`` is any number without a fractional part, so 2.0 is an integer (a client's JSON
    encoder may write a large integer that way); booleans and strings stay refused (the field is strict)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def json_int(**constraints: Any) -> Any:
    """A strict integer field that also takes an integral float, with its bounds (``ge``, ``le``) stated in the
    schema as minimum and maximum (written before the validator: after it, pydantic leaves them out of a nullable
    field's schema)."""
    return Annotated[int, Strict(), Field(**constraints), BeforeValidator(_integral)]

# ---- object-level rules ----------------------------------------------------------------------------------------
UNIQUE: dict[str, Any] = {"uniqueItems": True}


def one_of_present(first: str, first_type: str, second: str, second_type: str) -> dict[str, Any]:
    """Exactly one of two optional, nullable fields carries a value (null counts as absent): not both, not neither.

    Written with ``not`` rather than ``oneOf``: SDK generators (openapi-python-client) read an object's ``oneOf`` as
    a union of types and drop the model, while they leave ``not`` to the server."""
    return {"not": {"anyOf": [
        {"required": [first, second], "properties": {first: {"type": first_type}, second: {"type": second_type}}},
        {"properties": {first: {"type": "null"}, second: {"type": "null"}}}]}}


# x (a dense vector) or features (a feature dictionary), per example of learn and unlearn
EXAMPLE_SHAPE = one_of_present("x", "array", "features", "object")
# x (dense vectors) or features (feature dictionaries), for predict
PREDICT_SHAPE = one_of_present("x", "array", "features", "array")

# n_classes and classes go with loss softmax, which needs one of them (null counts as absent), or with loss squared
# (a family that classifies by least squares, exact_ridge; the others refuse them: 422 invalid-model-spec)
def _classifier_defaults() -> list[str]:
    """The families whose default loss (a spec without one) is one they classify with: they take n_classes."""
    from ..unlearning import ALGORITHMS, hyperparameter_table

    return sorted(name for name, cls in ALGORITHMS.items()
                  if hyperparameter_table(name).default_loss in cls.classifier_losses)


SOFTMAX_FIELDS: dict[str, Any] = {
    "if": {"required": ["loss"], "properties": {"loss": {"const": "softmax"}}},
    "then": {"anyOf": [{"required": ["n_classes"], "properties": {"n_classes": {"type": "integer"}}},
                       {"required": ["classes"], "properties": {"classes": {"type": "array"}}}]},
    # loss squared, or no loss with a family whose default loss classifies (exact_ridge: squared, least squares)
    "else": {"if": {"anyOf": [{"required": ["loss"], "properties": {"loss": {"const": "squared"}}},
                              {"anyOf": [{"not": {"required": ["loss"]}}, {"properties": {"loss": {"const": None}}}],
                               "required": ["algorithm"], "properties": {"algorithm": {"enum": _classifier_defaults()}}}]},
             "else": {"properties": {"n_classes": {"type": "null"}, "classes": {"type": "null"}}}},
}

# a feature spec declares at least one numeric or categorical field
SOME_FEATURE_FIELD: dict[str, Any] = {
    "not": {"properties": {"numeric": {"maxProperties": 0}, "categorical": {"maxItems": 0}}}}


# a dict whose keys carry a pattern: pydantic writes the pattern as patternProperties, which leaves a key that does not
# match it (and its value) unconstrained; propertyNames states that every key must match
def key_names(pattern: str, min_length: int, max_length: int) -> dict[str, Any]:
    return {"propertyNames": {"minLength": min_length, "maxLength": max_length, "pattern": pattern}}
