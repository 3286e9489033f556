"""OLU_MAX_REQUEST_MEMORY enforced per request for rows that grow when encoded (issue 37, F5-F).

A feature dictionary of a few bytes becomes a dense row of the model's hashed dimension (app/features.py): 1 000
dictionaries of ``{"c": "v"}`` (14 KB of JSON) at dim 10^5 are 800 MB of float64 rows.  Predict and evaluate encode
and score such rows in chunks (app/services/prediction.py), so their memory does not grow with the batch; a learn,
and a forget of a model that takes the forgotten records' features from the client, hand the engine the whole
batch as one dense array (the engine is numpy on dense rows), so such a request is refused before it is encoded
when that array would exceed the limit: 413 ``batch-too-large`` naming the limit and the most rows that fit.
Dense requests need no check here: their values are in the body, whose size OLU_MAX_BODY_BYTES bounds.
"""
from __future__ import annotations

from ..errors import Problem
from ..features import dense_width

F64 = 8


def dense_bytes(spec, n: int) -> int:
    """Bytes of the float64 rows ``n`` inputs of a model with feature spec become once encoded."""
    return F64 * int(n) * dense_width(spec)


def most_rows(spec, memory: int) -> int:
    """The most inputs whose encoded rows fit ``memory`` bytes (at least 1)."""
    return max(1, int(memory) // (F64 * dense_width(spec)))


def check_encoded_rows(spec, n: int, memory: int, what: str = "examples") -> None:
    """Refuse (413) a request whose ``n`` feature dictionaries would become more than ``memory`` bytes of dense
    rows; models without a feature spec pass (their rows are the body's)."""
    if getattr(spec, "features", None) is None:
        return
    need = dense_bytes(spec, n)
    if need > memory:
        most = most_rows(spec, memory)
        raise Problem(413, "batch-too-large", f"These {n} {what} would take {need} bytes once encoded ({n} rows of "
                      f"the model's {dense_width(spec)} hashed features), over the per-request memory limit of "
                      f"{int(memory)} bytes (OLU_MAX_REQUEST_MEMORY): send at most {most} per request.",
                      limit=int(memory), max_rows=most)
