"""The house stays layered: imports only go down, no cycles, one backend never imports the other.

Read with `ast` (every import in a module, at any depth, counts), so a violation fails here before
a reader meets it. The layers, bottom to top (see the README):

    hardware, config, user_files, native -> core -> workload, policies, routing, sim, engine -> runs -> api, cli, report, router, integrations
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "cadencerl"

LAYER = {
    "hardware": 0, "config": 0, "user_files": 0, "native": 0,
    "core": 1,
    "workload": 2, "policies": 2, "admission": 2, "sim": 2, "engine": 2, "devpool": 2,
    "runs": 3,
    "api": 4, "cli": 4, "report": 4, "router": 4, "integrations": 4,
}
# Within one layer, a unit may import another only along these (importer, imported) edges: a router
# may use a policy helper, never the reverse; the backends never see each other.
SIDEWAYS = {("config", "hardware"), ("config", "user_files"), ("admission", "policies"), ("devpool", "engine"), ("cli", "api"), ("cli", "report"), ("cli", "router")}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
MAX_DOCSTRING_LINES = 15   # what a module does and why; figures, history and measurements go to docs/ (issue 35)


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(path: Path, name: str) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cadencerl"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("cadencerl"):
                found.add(mod)
                found.update(f"{mod}.{a.name}" for a in node.names)
    return found


def unit(module: str) -> str | None:
    """The layer unit of a module: its top-level package or module under cadencerl."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


GRAPH = {
    name: {m for m in imports_of(path, name) if m in modules()} - {name} for name, path in modules().items()
}


def test_every_unit_has_a_layer() -> None:
    units = {unit(m) for m in GRAPH} - {None}
    assert units <= set(LAYER), f"modules outside any layer: {sorted(units - set(LAYER))}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_only_go_down(module: str) -> None:
    here = unit(module)
    if here is None:
        return
    for target in GRAPH[module]:
        there = unit(target)
        if there is None or there == here:
            continue
        if LAYER[there] == LAYER[here]:
            assert (here, there) in SIDEWAYS, f"{module} imports {target}: same layer, not an allowed edge"
        else:
            assert LAYER[there] < LAYER[here], f"{module} imports {target}, a layer above it"


def test_no_import_cycles() -> None:
    # Tarjan-free check: depth-first search over module edges, reporting the first cycle found.
    # Package __init__ re-exports are edges too, except a package importing its own members.
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_modules_stay_small(module: str) -> None:
    lines = len(modules()[module].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines (at most {MAX_MODULE_LINES})"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_module_docstrings_stay_short(module: str) -> None:
    doc = ast.get_docstring(ast.parse(modules()[module].read_text())) or ""
    lines = len(doc.splitlines())
    assert lines <= MAX_DOCSTRING_LINES, (f"{module}'s docstring has {lines} lines (at most {MAX_DOCSTRING_LINES}): "
                                          "say what the module does and why, and move notes to docs/")


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_functions_stay_short(module: str) -> None:
    tree = ast.parse(modules()[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            assert lines <= MAX_FUNCTION_LINES, f"{module}.{node.name} has {lines} lines (at most {MAX_FUNCTION_LINES})"


def _policy_traits() -> set[str]:
    """Every name the policy contract (core/policy.py) declares on `Policy`, plus `inner` (an
    admission layer's placement policy, reached through `placement_of`)."""
    tree = ast.parse((ROOT / "core" / "policy.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Policy")
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return names | {n.name for n in cls.body if isinstance(n, ast.FunctionDef)} | {"inner"}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_policy_trait_is_read_through_getattr(module: str) -> None:
    """A trait read with `getattr(policy, "trait", default)` is a second contract with its own default."""
    traits = _policy_traits()
    for node in ast.walk(ast.parse(modules()[module].read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in traits):
            pytest.fail(f"{module}:{node.lineno} reads the policy trait {node.args[1].value!r} with {node.func.id}; "
                        "declare it on core.policy.Policy and read it directly")
