"""The clairvoyant reference run, and every run's distance from it and from the bound.

`runs/` is where sealed lengths may be opened for an explicitly named oracle: this module makes
the key, hands it to the clairvoyant policy (`policies/oracle.py`) and to the simulator, and
nowhere else. A reference run costs one more simulation of the scenario.
"""

from __future__ import annotations

from collections.abc import Callable

from cadencerl.config import Scenario
from cadencerl.policies.oracle import Clairvoyant
from cadencerl.runs.assemble import build_pool
from cadencerl.runs.simulate import simulate
from cadencerl.workload.generate import generate

REFERENCE = Clairvoyant.name   # the policy name its results carry; the report's runner asks for it by this name


def clairvoyant_reference(scenario: Scenario, progress: Callable[[int, int], None] | None = None) -> dict:
    """Simulate the clairvoyant oracle on `scenario`; its result, like any run's."""
    key = object()
    specs = generate(scenario.workload, scenario.seed, key)
    _workers, perfs = build_pool(scenario)
    return simulate(scenario, Clairvoyant(key, specs, perfs), key=key, progress=progress)


def distance(result: dict, reference: dict) -> dict:
    """How far a run is from the tightened bound and from the clairvoyant reference."""
    return {
        "throughput_fraction_of_bound": result["throughput_tok_s"] / result["bound_throughput_tok_s"],
        "p95_multiple_of_bound": result["latency_p95_s"] / max(result["bound_latency_p95_s"], 1e-12),
        "throughput_fraction_of_reference": result["throughput_tok_s"] / reference["throughput_tok_s"],
        "p95_multiple_of_reference": result["latency_p95_s"] / max(reference["latency_p95_s"], 1e-12),
        "reference_throughput_tok_s": reference["throughput_tok_s"],
        "reference_latency_p95_s": reference["latency_p95_s"],
    }


def with_reference(results: list[dict], scenario: Scenario,
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """Add each result's distance from one clairvoyant run of `scenario` (in place); return that run."""
    reference = clairvoyant_reference(scenario, progress)
    for r in results:
        r.update(distance(r, reference))
    return reference
