"""A prompt's token ids are checked and grouped at C speed, with the same answers as the plain rule."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadencerl.router.requests import ApiError, _group, _route, is_token_ids, prompt_group, resume_group

JSON_SCALARS = st.one_of(st.integers(min_value=-5, max_value=2**70), st.booleans(), st.none(),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3))


def plainly_token_ids(value: object) -> bool:
    """The rule as written plainly: a non-empty list of ints that are not bools, none negative."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


@given(st.one_of(st.lists(JSON_SCALARS, max_size=8), st.lists(st.integers(min_value=0, max_value=2**70)),
                 JSON_SCALARS))
def test_the_fast_check_answers_as_the_plain_rule(value) -> None:
    assert is_token_ids(value) == plainly_token_ids(value)


@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=64), st.data())
def test_a_resumed_prompt_is_in_the_group_of_the_prompt_it_continues(ids: list[int], data) -> None:
    cut = data.draw(st.integers(min_value=0, max_value=len(ids)))
    routed = _route(json.dumps({"prompt": ids}).encode(), {}, "prompt", {"rlvr": 1.0}, "rlvr")
    assert routed.group == prompt_group(ids) == resume_group(tuple(ids[:cut]), ids[cut:])


def test_groups_tell_prompts_apart_whatever_their_ids() -> None:
    assert prompt_group([1, 2]) != prompt_group([2, 1]) != prompt_group([1, 2, 0])
    assert prompt_group([2**70, 1]) == _group(b"[%d, 1]" % 2**70) != prompt_group([1])     # past 8 bytes: by repr
    assert prompt_group(["a b"]) != prompt_group(["a", "b"])


@pytest.mark.parametrize("prompt", [[1, True], [1, -2], [1, 2.0], [[1], [True]], []])
def test_what_is_not_token_ids_is_a_400_naming_the_prompt(prompt) -> None:
    with pytest.raises(ApiError) as err:
        _route(json.dumps({"prompt": prompt}).encode(), {}, "prompt", {"rlvr": 1.0}, "rlvr")
    assert err.value.status == 400 and err.value.param == "prompt"
