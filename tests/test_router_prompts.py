"""A prompt's token ids are checked and grouped at C speed, with the same answers as the plain rule."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadencerl.router.prompt_keys import group_of, prefix_chain, prompt_group, resume_group
from cadencerl.router.requests import ApiError, _route, is_token_ids

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
    assert prompt_group([2**70, 1]) == group_of(b"[%d, 1]" % 2**70) != prompt_group([1])     # past 8 bytes: by repr
    assert prompt_group(["a b"]) != prompt_group(["a", "b"])


@pytest.mark.parametrize("prompt", [[1, True], [1, -2], [1, 2.0], [[1], [True]], []])
def test_what_is_not_token_ids_is_a_400_naming_the_prompt(prompt) -> None:
    with pytest.raises(ApiError) as err:
        _route(json.dumps({"prompt": prompt}).encode(), {}, "prompt", {"rlvr": 1.0}, "rlvr")
    assert err.value.status == 400 and err.value.param == "prompt"


def test_prompts_sharing_a_head_share_its_prefix_chain_and_nothing_after() -> None:
    """A link is 64 tokens: 64 ids, or 256 characters of text or of a chat's role and text."""
    system = "You are a careful assistant. " * 20          # 580 characters: two whole links
    a, b = prefix_chain(system + "What is 2 + 2?" * 40), prefix_chain(system + "Name a prime." * 40)
    assert len(a) == len(b) == 4 and a[:2] == b[:2] and a[2] != b[2]
    chat = [{"role": "system", "content": system}, {"role": "user", "content": "hi " * 200}]
    other = [{"role": "system", "content": system}, {"role": "user", "content": "yo " * 200}]
    assert prefix_chain(chat)[:2] == prefix_chain(other)[:2] and prefix_chain(chat)[2] != prefix_chain(other)[2]
    assert prefix_chain([{"role": "user", "content": system}])[0] != prefix_chain(chat)[0]    # the role counts
    ids = list(range(200))
    assert prefix_chain(ids)[:3] == prefix_chain(ids[:192] + [7] * 8)[:3] and len(prefix_chain(ids)) == 3
    assert prefix_chain("short") == prefix_chain([1, 2, 3]) == prefix_chain(["a", "b"]) == ()
    assert prefix_chain([2**70] * 100) == ()                   # past 8 bytes an id: no chain, as its group
    assert len(prefix_chain("x" * 10**6)) == 64               # the first 4,096 tokens only
    assert len(prefix_chain("é" * 600)) == len(prefix_chain("e" * 600)) == 2     # characters, not bytes
