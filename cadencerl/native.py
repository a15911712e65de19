"""The simulator's hot modules, the controller, the state it reads and the policies it runs most
(CadenceRL, the request routers, MISA-T), and the router's own part of a request (its parse, its
session's entry and release, the Rust data path's owner) compiled to C by mypyc (`make native`), or
run as plain Python.
Compiled, a policy's traits and the controller are still subclassed and overridden in plain Python
(core/policy.py says how); a compiled class takes no patched method (tests/conftest.py).

A compiled module sits beside its source and Python prefers it, so one built before an edit would
run old code without a word. The build therefore records the hash of every source the compiled
code was made from (the modules and the cadencerl modules they import, transitively) and which
modules it compiled (`_native.json`). At import, unless that record matches the tree exactly (and
CADENCERL_PURE_PYTHON is unset or 0), every cadencerl module is loaded from its .py, with one line
saying why. Results are the same either way (tests/test_native.py); the speed-up: docs/simulator.md.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.abc
import importlib.machinery
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
           "cadencerl.policies.growth", "cadencerl.policies.cadence_rooms",
           # the controller, its state and the policies a run or a router decides with most: compiled
           # with the classes they read, since plain Python reads a compiled class's fields slowly
           "cadencerl.core.spec", "cadencerl.core.trajectory", "cadencerl.core.worker", "cadencerl.core.actions",
           "cadencerl.core.pending", "cadencerl.core.fresh", "cadencerl.core.credits", "cadencerl.core.view",
           "cadencerl.core.residency", "cadencerl.core.policy", "cadencerl.core.controller", "cadencerl.core.live",
           "cadencerl.policies.base", "cadencerl.policies.cadence", "cadencerl.policies.routers",
           "cadencerl.policies.prefix_tree",
           "cadencerl.admission.gated", "cadencerl.admission.misa", "cadencerl.admission.misa_learn",
           # the router's own part of a request: its parse, its session's entry and release, the pass's service
           "cadencerl.router.requests", "cadencerl.router.prompt_keys", "cadencerl.router.live",
           "cadencerl.router.engines", "cadencerl.router.service", "cadencerl.router.rust_owner")
PURE_ENV = "CADENCERL_PURE_PYTHON"


def source(module: str) -> Path:
    return PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sources(modules: tuple[str, ...] = MODULES) -> dict[str, str]:
    """Module -> hash of its source, for `modules` and every cadencerl module they import, transitively
    (the compiled code was typed against those too)."""
    seen: dict[str, str] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        path = source(name)
        if name in seen or not path.exists():
            continue
        seen[name] = digest(path)
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cadencerl"):
                todo += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return dict(sorted(seen.items()))


def stale(record: dict) -> str | None:
    """Why the compiled copies may not be used (None: they may): the record's modules are not this
    code's, a source it vouches for changed, or a compiled file is missing."""
    if record.get("modules") != list(MODULES):
        return "the compiled modules are another version's"
    for name, recorded in record.get("sources", {}).items():
        if not source(name).exists() or digest(source(name)) != recorded:
            return f"{source(name).relative_to(PACKAGE.parent)} changed since `make native` compiled it"
    missing = [m for m in (*MODULES, f"{GROUP}__mypyc") if _compiled_file(m) is None]
    return f"{missing[0]} is not compiled" if missing else None


def _compiled_file(module: str) -> Path | None:
    path = source(module)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if path.with_suffix(suffix).exists():
            return path.with_suffix(suffix)
    return None


class _FromSource(importlib.abc.MetaPathFinder):
    """Finds a cadencerl module's .py ahead of any compiled copy beside it (all of them, or those the
    build did not compile: a leftover of another build)."""

    def __init__(self, compiled: tuple[str, ...] = ()) -> None:
        self.compiled = compiled

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("cadencerl.") or name in self.compiled:
            return None
        py = source(name)
        return importlib.util.spec_from_file_location(name, py) if py.exists() else None


def guard() -> None:
    """Run from the package's __init__, before any compiled module can be imported."""
    try:
        record = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else None
    except (OSError, ValueError):
        record = {}
    why = stale(record) if record is not None else "never built"
    if os.environ.get(PURE_ENV, "0") not in ("", "0"):
        why = f"{PURE_ENV} is set"
    elif why is not None and record is not None:
        print(f"cadencerl: running the simulator as plain Python ({why}; `make native` rebuilds it)", file=sys.stderr)
    sys.meta_path.insert(0, _FromSource() if why else _FromSource(compiled=MODULES))


def compiled() -> bool:
    """Does this process run the compiled simulator (every hot module resolves to its compiled file)?"""
    for module in MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None or spec.origin.endswith(".py"):
            return False
    return True


def build() -> None:
    """Compile the hot modules in place and record what they were made from (needs mypy and a C
    compiler). Floating-point contraction is off, so the arithmetic is Python's on every CPU."""
    from mypyc.build import mypycify
    from setuptools import setup

    MANIFEST.unlink(missing_ok=True)
    for leftover in PACKAGE.rglob("*.so"):
        if not leftover.name.startswith("_datapath"):    # the router's Rust data path (make router-native)
            leftover.unlink()
    before = sources()
    paths = [str(source(m).relative_to(PACKAGE.parent)) for m in MODULES]
    os.chdir(PACKAGE.parent)
    os.environ["CFLAGS"] = (os.environ.get("CFLAGS", "") + " -ffp-contract=off").strip()
    mypy_options = ["--ignore-missing-imports", "--follow-imports=silent"]
    setup(name="cadencerl-native", packages=[], script_args=["build_ext", "--inplace", "--force"],
          ext_modules=mypycify([*paths, *mypy_options], group_name=GROUP, opt_level="3"))
    if sources() != before:
        raise SystemExit("cadencerl: a source changed while it was compiled: run `make native` again")
    MANIFEST.write_text(json.dumps({"modules": list(MODULES), "sources": before}, indent=1) + "\n")
    print(f"cadencerl: compiled {len(MODULES)} simulator modules ({', '.join(MODULES)})")
