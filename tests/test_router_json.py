"""The router reads a request's JSON with msgspec, and with the standard library what msgspec refuses:
every body must read exactly as `json.loads` reads it (or be refused as it refuses it)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadencerl.router.requests import ApiError, _json_object, read_json

SCALARS = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.booleans(), st.none(),
                    st.floats(allow_nan=False), st.text())
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                      max_leaves=20)


@given(VALUES)
def test_every_value_reads_as_the_standard_library_reads_it(value) -> None:
    raw = json.dumps(value).encode()
    assert repr(read_json(raw)) == repr(json.loads(raw))     # repr: 1 and 1.0, 0.0 and -0.0 told apart
    utf8_raw = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    try:
        expected = json.loads(utf8_raw)
    except ValueError:
        with pytest.raises(ValueError):
            read_json(utf8_raw)
    else:
        assert repr(read_json(utf8_raw)) == repr(expected)


@pytest.mark.parametrize("raw", [b'{"prompt": [%d]}' % 2**70, b'{"x": NaN}', b'{"x": "\\ud800"}',
                                 '{"prompt": "hi"}'.encode("utf-16"), b'{"a": 1, "a": 2}', b"[-0, 1E2, -0.0, 1.5e-320]"])
def test_edge_cases_read_as_before(raw: bytes) -> None:
    got, expected = read_json(raw), json.loads(raw)
    if isinstance(expected, dict) and isinstance(expected.get("x"), float):
        assert math.isnan(got["x"])
    else:
        assert repr(got) == repr(expected)


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": 1,}', b'"\x01"', b"[" * 100_000])
def test_a_body_neither_reads_is_a_400(raw: bytes) -> None:
    with pytest.raises(ApiError) as err:
        _json_object(raw)
    assert err.value.status == 400
