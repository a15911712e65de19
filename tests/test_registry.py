"""Names, variant files and renamed keys: each resolves to one policy or is refused naming its replacement."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadencerl.config import ConfigError, builtin_scenario, load_scenario_dict
from cadencerl.runs.registry import FACTORIES, GROUPABLE, RETIRED, make_policy

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = sorted((ROOT / "benchmarks" / "variants").glob("*.yaml"))


def test_the_registry_holds_the_papers_policies_baselines_and_four_ablations():
    ablations = {n for n in FACTORIES if n.startswith("cadence-")}
    assert ablations == {"cadence-no-pacing", "cadence-no-concentration", "cadence-no-affinity", "cadence-no-kv-prep"}
    assert not [n for n in FACTORIES if n.endswith("-grouped")]


@pytest.mark.parametrize("old", sorted(RETIRED))
def test_a_retired_name_is_refused_naming_its_replacement(old):
    with pytest.raises(ConfigError) as err:
        make_policy(old, builtin_scenario("16a8h" if not old.startswith("dora") else "h800-16"))
    message = str(err.value)
    if old.endswith("-grouped"):
        assert "--grouped" in message
    else:
        assert f"benchmarks/variants/{old}.yaml" in message and (ROOT / "benchmarks" / "variants" / f"{old}.yaml").exists()


@pytest.mark.parametrize("path", VARIANTS, ids=[p.stem for p in VARIANTS])
def test_every_variant_file_loads_under_its_label_and_changes_cadence(path):
    s = builtin_scenario("16a16b8h")
    policy = make_policy(str(path), s)
    assert policy.name == path.stem and policy.params != s.cadence


def test_a_variant_keeps_the_scenarios_other_cadence_fields():
    s = builtin_scenario("16a16b8h").with_overrides(cadence={"delta": 512, "spread": {"fair_share": 2.0}})
    policy = make_policy(str(ROOT / "benchmarks" / "variants" / "cadence-home-first.yaml"), s)
    assert policy.params.delta == 512 and policy.params.spread.fair_share == 2.0 and policy.params.spread.home == "first"


def test_a_bad_variant_file_names_its_field(tmp_path):
    bad = tmp_path / "v.yaml"
    bad.write_text("label: mine\npolicy: cadence\ncadence:\n  spread: {home: sideways}\n")
    with pytest.raises(ConfigError, match=r"variant mine: cadence\.spread\.home"):
        make_policy(str(bad), builtin_scenario("32a"))
    bad.write_text("label: mine\npolicy: laminar\ncadence: {}\n")
    with pytest.raises(ConfigError, match=r"policy: v\.yaml: policy"):
        make_policy(str(bad), builtin_scenario("32a"))


def test_grouped_routing_is_an_option_of_the_baselines_only():
    s = builtin_scenario("16a8h")
    assert make_policy("areal", s, grouped=True).name == "areal-grouped"
    assert set(GROUPABLE) == {"sync", "one-off", "dora", "laminar", "areal", "least-loaded"}
    with pytest.raises(ConfigError, match="grouped: cadence has no grouped routing"):
        make_policy("cadence", s, grouped=True)


@pytest.mark.parametrize("old, new", [("policy", "controller:"), ("affinity", "affinity_order:")])
def test_a_renamed_scenario_key_names_its_replacement(old, new):
    data = builtin_scenario("16a8h").model_dump()
    data[old] = {"eta": 1} if old == "policy" else ["H800", "A910X"]
    with pytest.raises(ConfigError, match=rf"^{old}: .*{new}"):
        load_scenario_dict(data)


def test_compare_grouped_gives_the_baselines_grouped_routing_and_leaves_cadence_as_it_is():
    import json

    from typer.testing import CliRunner

    from cadencerl.cli.main import app

    r = CliRunner().invoke(app, ["compare", "-s", "cpu-pair", "--policies", "cadence,areal", "--grouped",
                                 "--json", "-"])
    assert r.exit_code == 0, r.output
    names = [x["policy"] for x in json.loads(r.stdout[r.stdout.index("["):])]
    assert names == ["cadence", "areal-grouped"]


def test_the_decode_share_variant_gets_the_pools_perf_models_and_the_default_does_not():
    s = builtin_scenario("cpu-hetero")
    assert make_policy("cadence", s).decode_rate is None
    policy = make_policy(str(ROOT / "benchmarks" / "variants" / "cadence-decode-share.yaml"), s)
    assert policy.params.spread.share_by == "decode" and set(policy.decode_rate.perfs) == {("cpu-fast", 1), ("cpu-slow", 1)}
