"""narrow_words (issue 39: exact_ridge's stored sums in fewer bytes): any int64 words, extremes included, come back
bit for bit through the state codec; the width chosen is never worse than 8 bytes a word; a stored form that does
not match the size asked for is refused, never silently widened into other values."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from app.db.state_codec import pack_state, unpack_state
from app.unlearning.families.narrow_words import EXCEPTION_BYTES, narrow, wide

EXTREMES = [0, 1, -1, 2**31, -(2**31), 2**62, -(2**62), 2**63 - 1, -(2**63)]
words = arrays(np.int64, st.integers(0, 300),
               elements=st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from(EXTREMES),
                                  st.integers(-(2**20), 2**20)))


def _stored_bytes(d: dict, name: str) -> int:
    return d[f"{name}_nlo"].nbytes + d[f"{name}_nhi"].nbytes + EXCEPTION_BYTES * d[f"{name}_nxi"].size


@settings(deadline=None, max_examples=200)
@given(v=words)
def test_every_int64_comes_back_bit_for_bit(v):
    d = narrow(v, "A")
    back = wide(unpack_state(pack_state(d)), "A", v.size)
    assert back.dtype == np.int64 and np.array_equal(back, v)
    assert _stored_bytes(d, "A") <= 8 * v.size  # never more than the int64 words themselves


def test_small_sums_take_few_bytes_and_outliers_stay_exact():
    rng = np.random.default_rng(0)
    v = rng.integers(-(2**30), 2**30, size=10_000)
    v[[3, 777]] = [2**63 - 1, -(2**63)]  # two words that need all 8 bytes: stored as exceptions
    d = narrow(v, "A")
    assert d["A_nw"] == 4 and sorted(d["A_nxi"].tolist()) == [3, 777]
    assert _stored_bytes(d, "A") < 0.51 * v.nbytes
    assert np.array_equal(wide(d, "A", v.size), v)


def test_a_mismatched_stored_form_is_refused():
    v = np.arange(-50, 50, dtype=np.int64) * 2**40
    d = narrow(v, "A")
    with pytest.raises(ValueError, match="do not match"):
        wide(d, "A", v.size + 1)  # the size the model's dimension implies
    for bad in ({"A_nw": 9}, {"A_nw": 0}, {"A_nxi": np.array([v.size], np.int64), "A_nxv": np.zeros(1, np.int64)},
                {"A_nxi": np.array([-1], np.int64), "A_nxv": np.zeros(1, np.int64)},
                {"A_nlo": d["A_nlo"].astype(np.int64)}, {"A_nhi": np.zeros(3, np.uint8)}, {"A_nw": 3}):
        with pytest.raises(ValueError, match="do not match"):
            wide({**d, **bad}, "A", v.size)
