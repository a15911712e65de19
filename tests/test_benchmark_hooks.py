"""The benchmarks that trace CadenceRL subclass its index and policy: an override whose parameters
drift from the method it replaces breaks the benchmark only when it runs (minutes in), so check here."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from cadencerl.policies.cadence import Cadence
from cadencerl.policies.cadence_rooms import RoomIndex

REPO = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_the_delta_trace_overrides_take_what_the_methods_they_replace_take():
    trace = _load("delta_trace")
    for sub, base in ((trace.CountingIndex, RoomIndex), (trace.TracingCadence, Cadence)):
        overridden = [n for n, f in vars(sub).items() if callable(f) and n in vars(base) and not n.startswith("__")]
        assert overridden, sub
        for name in overridden:
            assert _parameters(getattr(sub, name)) == _parameters(getattr(base, name)), (sub.__name__, name)
