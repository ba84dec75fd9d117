"""operators.exactsum: exact, order- and split-independent double sums (Hypothesis vs
Fraction arithmetic, the exact truth)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import FormatError
from headrace.pipeline.operators import exactsum

finite = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1e308, 0.1, -0.0])


def truth(vals, ws) -> float:
    total = sum((Fraction(v) * w for v, w in zip(vals, ws, strict=True)), Fraction(0))
    try:
        return float(total)  # correctly rounded, ties to even
    except OverflowError:
        return math.inf if total > 0 else -math.inf


def limbs_of(vals, ws, groups=None, n=1):
    groups = np.zeros(len(vals), np.int64) if groups is None else np.asarray(groups)
    return exactsum.contributions(np.asarray(vals, np.float64), np.asarray(ws, np.int64),
                                  groups, n)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(finite, st.integers(-3, 3)), max_size=12))
def test_sum_is_the_correctly_rounded_exact_sum(items):
    vals = [v for v, _ in items]
    ws = [w for _, w in items]
    got = exactsum.to_double(exactsum.normalize(limbs_of(vals, ws)))[0]
    want = truth(vals, ws)
    assert got == want and (got != 0 or math.copysign(1, got) == 1)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(finite, st.integers(-3, 3)), max_size=12), st.randoms())
def test_sum_is_independent_of_order_and_split(items, rnd):
    """Any order and any split into batches (with a pack/unpack through state between
    them) gives the same limbs; retracting every input gives exactly zero."""
    vals = [v for v, _ in items]
    ws = [w for _, w in items]
    whole = exactsum.normalize(limbs_of(vals, ws))
    order = list(range(len(items)))
    rnd.shuffle(order)
    state = exactsum.pack(np.zeros((1, exactsum.LIMBS), np.int64))
    for chunk in np.array_split(np.array(order, np.int64), rnd.randint(1, 4)):
        cur = exactsum.unpack(state)
        step = limbs_of([vals[i] for i in chunk], [ws[i] for i in chunk])
        state = exactsum.pack(exactsum.normalize(cur + step))
    assert (exactsum.unpack(state) == whole).all()
    undone = exactsum.normalize(whole + limbs_of(vals, [-w for w in ws]))
    assert not undone.any()


def test_retracting_restores_the_previous_sum_bit_for_bit():
    s = exactsum.normalize(limbs_of([1e308, 1e308], [1, 1]))
    assert exactsum.to_double(s)[0] == math.inf
    s = exactsum.normalize(s + limbs_of([1e308], [-1]))
    assert exactsum.to_double(s)[0] == 1e308
    s = exactsum.normalize(s + limbs_of([0.1, 0.2, 1e308], [1, 1, -1]))
    assert exactsum.to_double(s)[0] == float(Fraction(0.1) + Fraction(0.2))  # not 0.1 + 0.2


def test_groups_are_summed_apart():
    s = exactsum.normalize(limbs_of([1.5, 2.0, -1.5, 1e-300], [1, 1, 1, 2], [0, 1, 0, 2], 3))
    assert exactsum.to_double(s).tolist() == [0.0, 2.0, 2e-300]


def test_too_large_batch_weights_are_refused():
    with pytest.raises(ValueError, match="weights sum"):
        exactsum.check_weights(np.array([exactsum.MAX_BATCH_WEIGHT], np.int64), "sum(x)")


@pytest.mark.parametrize("raw, match", [
    (b"\x00", "bad length"),
    (b"\x02\x00", "bad sign"),
    (b"\x00\x5b\x00\x00\x01\x00\x00\x01", "limb index"),
])
def test_malformed_state_raises_format_error(raw, match):
    with pytest.raises(FormatError, match=match):
        exactsum.unpack(pa.array([raw], pa.binary()))
