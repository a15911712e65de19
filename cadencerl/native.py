"""The simulator's hot modules (and CadenceRL's room and growth arithmetic) compiled to C by mypyc
(`make native`), or run as plain Python.

A compiled module sits beside its source and Python prefers it, so one built before its source was
edited would run the old code without a word. The build therefore records each source's hash
(`_native.json`); at import, if any source no longer matches (or CADENCERL_PURE_PYTHON=1), every
one of them is loaded from its .py instead, with one line saying so. Results are the same either
way (tests/test_native.py); the speed-up is in docs/simulator.md.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
MANIFEST = PACKAGE / "_native.json"
GROUP = "cadencerl._native"     # the compiled modules' shared library, inside the package
MODULES = ("cadencerl.sim.engine", "cadencerl.sim.backend", "cadencerl.sim.prefix_cache", "cadencerl.sim.context_order",
           "cadencerl.sim.kv_moves", "cadencerl.sim.links", "cadencerl.sim.weights", "cadencerl.hardware.perf",
           "cadencerl.policies.growth", "cadencerl.policies.cadence_rooms")
PURE_ENV = "CADENCERL_PURE_PYTHON"


def source(module: str) -> Path:
    return PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale(recorded: dict[str, str]) -> list[str]:
    """The modules whose source differs from the one their compiled copy was built from."""
    return [m for m in MODULES if recorded.get(m) != digest(source(m))]


class _FromSource(importlib.abc.MetaPathFinder):
    """Finds the hot modules' .py files ahead of the compiled copies beside them."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_file_location(name, source(name)) if name in MODULES else None


def guard() -> None:
    """Run from the package's __init__, before any hot module is imported: compiled copies are used
    only when the build's record vouches for every one of them."""
    recorded = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    changed = stale(recorded) if recorded else list(MODULES)
    if changed and recorded:
        print(f"cadencerl: running the simulator as plain Python ({source(changed[0]).relative_to(PACKAGE.parent)} "
              "changed since `make native` compiled it; `make native` rebuilds it)", file=sys.stderr)
    if changed or os.environ.get(PURE_ENV):
        sys.meta_path.insert(0, _FromSource())


def compiled() -> bool:
    """Does this process run the compiled simulator (the modules resolve to extension modules)?"""
    spec = importlib.util.find_spec(MODULES[0])
    return spec is not None and spec.origin is not None and not spec.origin.endswith(".py")


def build() -> None:
    """Compile the hot modules in place and record their sources (needs mypy and a C compiler)."""
    from mypyc.build import mypycify
    from setuptools import setup

    MANIFEST.unlink(missing_ok=True)
    paths = [str(source(m).relative_to(PACKAGE.parent)) for m in MODULES]
    os.chdir(PACKAGE.parent)
    mypy_options = ["--ignore-missing-imports", "--follow-imports=silent"]
    setup(name="cadencerl-native", packages=[], script_args=["build_ext", "--inplace"],
          ext_modules=mypycify([*paths, *mypy_options], group_name=GROUP, opt_level="3"))
    MANIFEST.write_text(json.dumps({m: digest(source(m)) for m in MODULES}, indent=1) + "\n")
    print(f"cadencerl: compiled {len(MODULES)} simulator modules ({', '.join(MODULES)})")
