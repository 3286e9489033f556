"""RFC 8785 canonical JSON, the signed/leaf byte strings of a receipt, and the parameter hash."""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.receipts.canonical import (CanonicalJSONError, canonical_json, parameters_sha256, receipt_leaf_bytes,
                                    receipt_signing_bytes)


@pytest.mark.parametrize("value, text", [
    (1e-7, "1e-7"),
    (0.1, "0.1"),
    (1e21, "1e+21"),
    (1e20, "100000000000000000000"),
    (-0.0, "0"),
    (1.0, "1"),
    (4.50, "4.5"),
    (2e-3, "0.002"),
    (1e-27, "1e-27"),
    (333333333.33333329, "333333333.3333333"),
    (1e30, "1e+30"),
    (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (9007199254740991, "9007199254740991"),
    (-9007199254740991, "-9007199254740991"),
    (True, "true"),
    (None, "null"),
])
def test_numbers_and_literals(value, text):
    assert canonical_json(value) == text.encode()


def test_rfc8785_section_3_2_2_example():
    # RFC 8785 §3.2.2 input and output
    src = ('{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
           '"string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
           '"literals": [null, true, false]}')
    want = ('{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
            '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}')
    assert canonical_json(json.loads(src)) == want.encode("utf-8")


def test_rfc8785_section_3_2_3_key_order_by_utf16_code_units():
    obj = {"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
           "1": "One", "\U0001F600": "Emoji: Grinning Face", "\u0080": "Control",
           "\u00f6": "Latin Small Letter O With Diaeresis"}
    keys = list(json.loads(canonical_json(obj)))
    # U+1F600 is the surrogate pair D83D DE00, which sorts before U+FB33 in UTF-16 (not in code points)
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001F600", "\ufb33"]


def test_nested_order_unicode_and_no_whitespace():
    obj = {"b": {"z": 1, "a": [3, {"y": "é", "x": "日本"}]}, "a": "\u2028"}
    out = canonical_json(obj)
    assert out == '{"a":"\u2028","b":{"a":[3,{"x":"日本","y":"é"}],"z":1}}'.encode("utf-8")
    assert canonical_json(json.loads(out)) == out


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 2**53, -(2**53), {1: "x"},
                                 {"a": [1, float("nan")]}, b"bytes", object(), {"s": {1, 2}}])
def test_rejects_unrepresentable(bad):
    with pytest.raises(CanonicalJSONError):
        canonical_json(bad)


def test_nan_error_names_the_member():
    with pytest.raises(ValueError, match=r"\$\.mechanism\.sigma.*NaN"):
        canonical_json({"mechanism": {"sigma": float("nan")}})


def test_numpy_scalars_and_tuples():
    assert canonical_json({"a": np.float64(0.1), "b": np.int64(3), "c": (1, 2), "d": np.bool_(True)}) == \
        b'{"a":0.1,"b":3,"c":[1,2],"d":true}'
    with pytest.raises(CanonicalJSONError):
        canonical_json({"a": np.float64("nan")})


def test_signing_and_leaf_bytes():
    r = {"id": "r1", "model_id": "m", "issued_at": "2026-01-01T00:00:00Z", "key_id": "k",
         "signature": "SIG", "proof": {"leaf_index": 0}}
    assert receipt_signing_bytes(r) == b'{"id":"r1","issued_at":"2026-01-01T00:00:00Z","key_id":"k","model_id":"m"}'
    assert receipt_leaf_bytes(r) == \
        b'{"id":"r1","issued_at":"2026-01-01T00:00:00Z","key_id":"k","model_id":"m","signature":"SIG"}'
    # the proof never affects either byte string; every other member does
    r2 = dict(r, proof={"leaf_index": 9})
    assert receipt_signing_bytes(r2) == receipt_signing_bytes(r)
    assert receipt_signing_bytes(dict(r, model_id="n")) != receipt_signing_bytes(r)
    with pytest.raises(CanonicalJSONError):
        receipt_leaf_bytes({"id": "unsigned"})


def test_parameters_sha256():
    w, b = [0.5, -1.25, 3.0], 0.125
    want = hashlib.sha256(struct.pack("<4d", 0.5, -1.25, 3.0, 0.125)).hexdigest()
    assert parameters_sha256(w, b) == want
    assert parameters_sha256(np.array(w), np.float64(b)) == want
    assert parameters_sha256(np.array(w, dtype=">f8"), b) == want          # byte order normalised
    assert parameters_sha256(np.array(w, dtype=np.float32), [b]) == want   # widened to float64
    assert parameters_sha256(w, b) != parameters_sha256(w[::-1], b)
    assert parameters_sha256(w, b) != parameters_sha256(w, -b)
    m = np.arange(6.0).reshape(2, 3)
    assert parameters_sha256(m, 1.0) == hashlib.sha256(np.append(m.ravel(), 1.0).astype("<f8").tobytes()).hexdigest()
    with pytest.raises(ValueError):
        parameters_sha256([1.0, float("nan")], 0.0)
    for bad in (np.array([1.0, np.inf]), np.array([[0.0], [np.nan]])):  # an array is checked in one call too
        with pytest.raises(ValueError, match="non-finite"):
            parameters_sha256(bad, 0.0)
    with pytest.raises(ValueError, match="bias"):
        parameters_sha256(np.zeros(3), np.array([np.nan]))


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=0, max_size=40),
       st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["<f8", ">f8"]), st.booleans())
def test_parameters_sha256_of_an_array_is_the_value_by_value_hash(w, b, order, strided):
    """A numpy array is hashed in one call (its bytes), a list value by value: the same hash, -0.0 and
    subnormals included, whatever the array's byte order or strides."""
    want = hashlib.sha256(struct.pack(f"<{len(w) + 1}d", *w, b)).hexdigest()
    a = np.array(w, dtype=order)
    if strided:  # a non-contiguous view of the same values
        a = np.repeat(a, 2)[::2]
    assert parameters_sha256(a, b) == want == parameters_sha256(list(w), b)
    assert parameters_sha256(np.append(a, b), None) == want


_json_scalars = st.none() | st.booleans() | st.text(max_size=8) | st.integers(-2**53 + 1, 2**53 - 1) | \
    st.floats(allow_nan=False, allow_infinity=False)
_json_values = st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=3) |
                            st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


@given(st.dictionaries(st.text(max_size=6).filter(lambda k: k not in ("signature", "proof")), _json_values,
                       max_size=8), st.text(max_size=12))
def test_signed_receipt_bytes_equal_the_two_canonical_forms(receipt, signature):
    """One canonicalisation per member gives exactly receipt_signing_bytes and receipt_leaf_bytes (keys of any
    script: RFC 8785 sorts by UTF-16 code units, which differs from code points outside the BMP)."""
    from app.receipts.canonical import signed_receipt_bytes

    signed_over = []

    def sign(data: bytes) -> str:
        signed_over.append(data)
        return signature

    got_signature, leaf = signed_receipt_bytes({**receipt, "proof": {"ignored": 1}}, sign)
    assert signed_over == [receipt_signing_bytes(receipt)]
    assert got_signature == signature
    assert leaf == receipt_leaf_bytes({**receipt, "signature": signature})
