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
    assert _peak("eta", [1, 3, 6], [5.0, 9.0, 9.0]) == "throughput is highest, and level, at eta = 3, 6"   # a plateau
    assert _peak("eta", [1, 3, 6], [9.0, 9.0, 9.0]) == "throughput is highest, and level, at eta = 1, 3, 6"
    assert _peak("eta", [3], [5.0]) == "one point only (eta = 3)"


def _run(tp: float, p95: float, evictions: int = 0, done: int = 100, nr95: float = 0.0, **more) -> dict:
    return {"throughput_tok_s": tp, "latency_p95_s": p95, "evictions": evictions, "trajectories_completed": done,
            "non_resident_p50": 0.0, "non_resident_p95": nr95, "tokens_generated": 1000, "sim_time_s": 50.0,
            "latency_p50_s": 20.0, "migrations": 0, **more}


def test_delta_is_credited_only_with_what_it_did():
    same = [_run(8284, 223.2), _run(8284, 223.2)]
    assert "never came into play" in _delta_reading([512, 4096], same)
    moved = [_run(8284, 223.2), _run(8284, 223.2, migrations=7)]      # same headline, other work done
    assert "placement alone" in _delta_reading([512, 4096], moved)
    fewer = _delta_reading([512, 1024, 4096], [_run(1, 1, 41), _run(1, 1, 30), _run(1, 1, 12)])
    assert "41 at 512, 30 at 1024, 12 at 4096" in fewer and "fewer sheds" in fewer and "never" not in fewer
    more = _delta_reading([512, 4096], [_run(1, 1, 3), _run(1, 1, 9)])
    assert "Not the fewer sheds" in more and "As designed" not in more
    middle = _delta_reading([512, 1024, 4096], [_run(1, 1, 0), _run(1, 1, 5), _run(1, 1, 0)])
    assert "5 at 1024" in middle


def test_an_all_zero_non_resident_section_has_no_figure_and_says_why_from_its_counts(tmp_path):
    ctx = Report(out=tmp_path, settings=None, runner=None)
    pools = [SimpleNamespace(name="32a"), SimpleNamespace(name="h800-16-32b")]
    text = _figure_or_why(ctx, pools, [_run(1, 1, 0, 8000), _run(1, 1, 41, 8192)])
    assert "no figure" in text and "41 evictions" in text and "at most 0.005 per completed trajectory, on h800-16-32b" in text
    assert not (tmp_path / "figures").exists()
    none = _figure_or_why(ctx, pools, [_run(1, 1, 0, 8000), _run(1, 1, 0, 8192)])
    assert "evicted no trajectory" in none and "at most" not in none
    shown = _figure_or_why(ctx, pools, [_run(1, 1, 41, 8000, nr95=0.2), _run(1, 1, 0, 8192)])
    assert "![non-resident](figures/non_resident.png)" in shown
    assert (tmp_path / "figures" / "non_resident.png").read_bytes()[:4] == b"\x89PNG"
