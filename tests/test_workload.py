import json

import numpy as np
import pytest

from cadencerl.config import ConfigError, LengthDist, TurnSpec, WorkloadSpec
from cadencerl.core.spec import HiddenLength, PeekError
from cadencerl.workload.generate import generate
from cadencerl.workload.trace import load_trace

KEY = object()


def spec(**kw) -> WorkloadSpec:
    base = dict(trajectories=2000, group_size=8, response=LengthDist(median=1000, sigma=1.0, cap=8000))
    base.update(kw)
    return WorkloadSpec(**base)


def reveal(t):
    return t.response.reveal(KEY)


def test_seeded_and_reproducible():
    a = [reveal(t) for t in generate(spec(), 7, KEY)]
    b = [reveal(t) for t in generate(spec(), 7, KEY)]
    c = [reveal(t) for t in generate(spec(), 8, KEY)]
    assert a == b and a != c


def test_groups_share_a_prompt_and_lengths_are_long_tailed_with_a_cap_mass():
    trajs = generate(spec(), 0, KEY)
    by_group = {}
    for t in trajs:
        by_group.setdefault(t.group, set()).add(t.prompt_len)
    assert len(by_group) == 250 and all(len(p) == 1 for p in by_group.values())
    lengths = np.array([reveal(t) for t in trajs])
    assert lengths.max() == 8000 and (lengths == 8000).sum() > 5      # point mass at the cap
    assert np.percentile(lengths, 99) > 5 * np.median(lengths)       # long tail
    within = [np.ptp([reveal(t) for t in trajs if t.group == g]) for g in range(50)]
    assert np.median(within) > 500                                    # same prompt, very different lengths


def test_multi_turn_sessions_have_turns_with_tool_latency():
    trajs = generate(spec(turns=TurnSpec(turns_min=2, turns_max=5)), 0, KEY)
    assert all(1 <= len(t.later_turns.reveal(KEY)) <= 4 for t in trajs)
    turns = [turn for t in trajs for turn in t.later_turns.reveal(KEY)]
    assert all(turn.tool_latency_s > 0 and turn.observation_len > 0 for turn in turns)


def test_hidden_length_raises_when_read_without_the_key():
    h = HiddenLength(42, KEY)
    assert h.reveal(KEY) == 42
    for peek in (lambda: int(h), lambda: h > 3, lambda: h + 1, lambda: h == 42, lambda: h.reveal(object()), lambda: bool(h)):
        with pytest.raises(PeekError):
            peek()


def test_trace_replay(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"prompt_len": 10, "response_len": 100, "group": 0},
        {"prompt_len": 10, "response_len": 200, "group": 0,
         "turns": [{"observation_len": 5, "tool_latency_s": 1.5, "response_len": 7}]},
    ]))
    trajs = load_trace(path, KEY)
    assert [reveal(t) for t in trajs] == [100, 200]
    assert trajs[1].later_turns.reveal(KEY)[0].response.reveal(KEY) == 7


def test_a_trace_line_without_a_group_is_a_group_of_its_own(tmp_path):
    """It once took its line number as its group id, joining whichever explicit group had that id."""
    path = tmp_path / "trace.jsonl"
    lines = [{"prompt_len": 10, "response_len": 5, "group": 1}, {"prompt_len": 30, "response_len": 5},
             {"prompt_len": 10, "response_len": 5, "group": 1}, {"prompt_len": 20, "response_len": 5}]
    path.write_text("\n".join(json.dumps(r) for r in lines))
    groups = [t.group for t in load_trace(path, KEY)]
    assert groups[0] == groups[2] == 1 and len({groups[1], groups[3], 1}) == 3
    lines.append({"prompt_len": 11, "response_len": 5, "group": 1})      # samples of one prompt share it
    path.write_text("\n".join(json.dumps(r) for r in lines))
    with pytest.raises(ConfigError, match=r"line 5: group 1 has prompt_len 10 \(line 1\), not 11"):
        load_trace(path, KEY)


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2: not JSON"),
    ('{"prompt_len": 10}', "line 2: field response_len: Field required"),
    ('{"prompt_len": -1, "response_len": 5}', "line 2: field prompt_len: Input should be greater than 0"),
    ('{"prompt_len": 1, "response_len": 5, "turns": [{"observation_len": 3}]}', "field turns.0.response_len: Field required"),
])
def test_malformed_trace_lines_name_the_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_len": 1, "response_len": 2}\n' + line + "\n")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_trace(path, KEY)
