"""The eta budget remembers its last answer: it must stay what the constraints say after every change."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cadencerl.core.credits import CreditModel

_step = st.one_of(
    st.tuples(st.just("ask"), st.integers(0, 3), st.integers(0, 2)),     # admissible(version, next batch)
    st.tuples(st.just("record"), st.integers(0, 3), st.integers(1, 3)),  # record(version, n)
    st.tuples(st.just("consume"), st.integers(0, 3), st.just(0)),        # consumed(tag), if any is outstanding
)


def _fresh_answer(credits: CreditModel, version: int, next_batch: int) -> int:
    return max(0, min(credits.room(version, next_batch), credits.total - credits.admitted))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(0, 2), st.lists(_step, max_size=40))
def test_the_remembered_budget_equals_the_one_computed_afresh(batch, eta, steps):
    """After every step the last question is asked again: an answer kept across `record` (lowered)
    or dropped by `consumed` is checked against the constraints themselves."""
    credits = CreditModel(batch, eta, total=40)
    asked = None
    for op, a, b in steps:
        if op == "ask":
            asked = (a, b)
        elif op == "record":
            credits.record(a, b)
        elif credits.outstanding_by_tag.get(a):
            credits.consumed(a)
        if asked is not None:
            assert credits.admissible(*asked) == _fresh_answer(credits, *asked)
