"""The compiled simulator (`make native`) gives the plain-Python one's results, and a compiled copy
older than its source is never run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cadencerl import native
from cadencerl.config import builtin_scenario
from cadencerl.runs.registry import make_policy
from cadencerl.runs.simulate import simulate

BUILT = pytest.mark.skipif(not native.compiled(), reason="`make native` has not compiled the simulator here")
SMALL = {"workload": {"trajectories": 512}, "trainer": {"batch_size": 128}}

RUN = """
import json, sys
from cadencerl import native
from cadencerl.config import builtin_scenario
from cadencerl.runs.registry import make_policy
from cadencerl.runs.simulate import simulate
name, policy, exact, small = sys.argv[1], sys.argv[2], sys.argv[3] == "exact", json.loads(sys.argv[4])
s = builtin_scenario(name).with_overrides(**small)
r = simulate(s, make_policy(policy, s), exact=exact)
print(json.dumps({"compiled": native.compiled(), "result": {k: v for k, v in r.items() if k != "wall_time_s"}}))
"""


def run_elsewhere(name: str, policy: str, exact: bool, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, name, policy, "exact" if exact else "closed", json.dumps(SMALL)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, **env}, check=True)
    return json.loads(out.stdout)


def test_a_record_of_other_sources_or_other_modules_is_stale() -> None:
    record = {"modules": list(native.MODULES), "sources": native.sources()}
    assert "cadencerl.core.trajectory" in record["sources"]     # what the compiled code was typed against
    edited = {**record, "sources": {**record["sources"], "cadencerl.core.trajectory": "0" * 64}}
    assert native.stale(edited) == "cadencerl/core/trajectory.py changed since `make native` compiled it"
    assert native.stale({**record, "modules": record["modules"][:-1]}) == "the compiled modules are another version's"
    assert native.stale({}) == "the compiled modules are another version's"


@BUILT
@pytest.mark.parametrize(("name", "policy", "exact"), [("16a16b8h", "cadence", False), ("16a16b8h", "areal", True),
                                                       ("mixed-16a8h", "misa+cadence", False),
                                                       ("16a16b8h", "laminar", False)])
def test_compiled_and_plain_python_give_the_same_run(name: str, policy: str, exact: bool) -> None:
    """Every figure of the run, to the last digit (the wall time aside). Laminar, a plain-Python
    policy, gives its traits as class attributes, which the compiled code must see (core/policy.py)."""
    s = builtin_scenario(name).with_overrides(**SMALL)
    r = simulate(s, make_policy(policy, s), exact=exact)
    here = {k: v for k, v in r.items() if k != "wall_time_s"}
    pure = run_elsewhere(name, policy, exact, **{native.PURE_ENV: "1"})
    assert pure["compiled"] is False
    assert json.dumps(pure["result"], sort_keys=True) == json.dumps(here, sort_keys=True)   # 1 and 1.0 differ here


def _copy_and_probe(tmp_path: Path):
    """A copy of the built package and a probe of which simulator an import of it runs."""
    copy = tmp_path / "cadencerl"
    shutil.copytree(native.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop(native.PURE_ENV, None)

    def probe(code: str = "from cadencerl import native; print(native.compiled())"):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                              timeout=60, check=True)
    return copy, probe


@BUILT
def test_a_compiled_copy_older_than_any_source_it_was_typed_against_is_not_run(tmp_path: Path) -> None:
    copy, probe = _copy_and_probe(tmp_path)
    fresh = probe()
    assert fresh.stdout.strip() == "True" and fresh.stderr == ""
    with open(copy / "core" / "worker.py", "a") as f:      # not compiled itself; the compiled code reads it
        f.write("# edited after the build\n")
    edited = probe()
    assert edited.stdout.strip() == "False"
    assert "cadencerl/core/worker.py changed since `make native` compiled it" in edited.stderr


@BUILT
def test_a_missing_compiled_module_runs_all_of_them_as_plain_python(tmp_path: Path) -> None:
    copy, probe = _copy_and_probe(tmp_path)
    next((copy / "hardware").glob("perf.*.so")).unlink()
    run = probe("from cadencerl import native; from cadencerl.sim import engine; "
                "print(native.compiled(), engine.__file__)")
    assert run.stdout.split()[0] == "False" and run.stdout.split()[1].endswith("engine.py")
    assert "cadencerl.hardware.perf is not compiled" in run.stderr


@BUILT
def test_a_compiled_file_the_build_did_not_make_is_never_imported(tmp_path: Path) -> None:
    """A leftover of another build (here a stand-in: another module's library under this name)."""
    copy, probe = _copy_and_probe(tmp_path)
    library = next((copy / "policies").glob("growth.*.so"))
    shutil.copy(library, library.with_name(library.name.replace("growth", "laminar", 1)))
    run = probe("from cadencerl import native; from cadencerl.policies import laminar; "
                "print(native.compiled(), laminar.__file__)")
    assert run.stdout.split() == ["True", str(copy / "policies" / "laminar.py")]


@pytest.mark.parametrize("module", native.MODULES)
def test_no_compiled_function_catches_two_kinds_under_one_name(module):
    """mypyc types a name by its first binding: a second `except Other as exc` in the same function
    then fails with a TypeError where it should catch (a router's refusal once became a 500)."""
    import ast

    for fn in ast.walk(ast.parse(native.source(module).read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kinds: dict[str, str] = {}
            for node in ast.walk(fn):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type is not None:
                    kind = kinds.setdefault(node.name, ast.unparse(node.type))
                    assert kind == ast.unparse(node.type), \
                        f"{module}.{fn.name}: `{node.name}` is {kind} and {ast.unparse(node.type)}"
