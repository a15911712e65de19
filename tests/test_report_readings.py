"""The report's sentences say what its runs show: a peak only where the sweep has one, delta's effect only
where it acted, and no empty figure where every value is 0."""

from __future__ import annotations

from types import SimpleNamespace

from cadencerl.report.context import Report
from cadencerl.report.sections.residency import _figure_or_why
from cadencerl.report.sections.sensitivity import _delta_reading, _peak


def test_a_peak_is_named_only_with_a_point_on_each_side():
    assert _peak("eta", [1, 3, 6], [8.3, 15.0, 21.8]) == \
        "throughput rises over the whole range (eta = 6; no peak at eta <= 6)"
    assert _peak("eta", [1, 3, 6], [8.3, 22.0, 21.8]) == "throughput peaks at eta = 3"
    assert "is highest at the largest value tried (eta = 6" in _peak("eta", [1, 3, 6], [9.0, 8.0, 10.0])
    assert _peak("eta", [1, 3, 6], [9.0, 8.0, 7.0]) == "throughput is highest at the smallest value tried (eta = 1)"


def _run(tp: float, p95: float, evictions: int = 0, done: int = 100, nr95: float = 0.0) -> dict:
    return {"throughput_tok_s": tp, "latency_p95_s": p95, "evictions": evictions, "trajectories_completed": done,
            "non_resident_p50": 0.0, "non_resident_p95": nr95}


def test_delta_is_credited_only_with_what_it_did():
    same = [_run(8284, 223.2), _run(8284, 223.2)]
    assert "never came into play" in _delta_reading([0, 0], same)
    differ = [_run(8284, 223.2), _run(8300, 230.0)]
    assert "placement alone" in _delta_reading([0, 0], differ)
    acted = _delta_reading([41, 12], differ)
    assert "evictions go from 41 to 12" in acted and "never" not in acted


def test_an_all_zero_non_resident_section_has_no_figure_and_says_why_from_its_counts(tmp_path):
    ctx = Report(out=tmp_path, settings=None, runner=None)
    pools = [SimpleNamespace(name="32a"), SimpleNamespace(name="h800-16-32b")]
    text = _figure_or_why(ctx, pools, [_run(1, 1, 0, 8000), _run(1, 1, 41, 8192)])
    assert "no figure" in text and "41 of the 16,192" in text and "at most 0.5% of a pool's (h800-16-32b)" in text
    assert "fewer than the 5% a P95 would see" in text
    assert not (tmp_path / "figures").exists()
    many = _figure_or_why(ctx, pools, [_run(1, 1, 900, 8000), _run(1, 1, 0, 8192)])
    assert "more than 5%" in many                    # evicted often, yet no time off a worker
    shown = _figure_or_why(ctx, pools, [_run(1, 1, 41, 8000, nr95=0.2), _run(1, 1, 0, 8192)])
    assert "![non-resident](figures/non_resident.png)" in shown
    assert (tmp_path / "figures" / "non_resident.png").read_bytes()[:4] == b"\x89PNG"
