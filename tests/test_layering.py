"""The architecture, held by tests: arrows point one way, no import cycles, no reaching into another
package's private modules, and the light packages stay light.

    federation ──► knowledge ◄── sim

Imports are read from the source (every `import`, at module level, inside functions and under
TYPE_CHECKING alike), so a cycle that only bites at run time in one code path still fails here.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("knowledge", "sim", "federation")
MAY_IMPORT = {"knowledge": set(), "sim": {"knowledge"}, "federation": {"knowledge"}}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The modules of ours that `name` imports (a name imported from a package counts as its
    submodule when one exists by that name)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports. Parsed when a test first asks (once per xdist
    worker that runs one), not when every worker collects this file."""
    return {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(_graph()[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(_graph()):
        if node not in index:
            visit(node)
    return found


def _top(name: str) -> str:
    return name.partition(".")[0]


def test_there_is_no_import_cycle():
    assert _cycles() == []


def test_arrows_point_one_way():
    wrong = sorted(
        (name, target)
        for name, targets in _graph().items()
        for target in targets
        if _top(target) != _top(name) and _top(target) not in MAY_IMPORT[_top(name)]
    )
    assert wrong == []


def test_no_package_imports_another_packages_private_modules():
    private = sorted(
        (name, target)
        for name, targets in _graph().items()
        for target in targets
        if _top(target) != _top(name) and any(p.startswith("_") for p in target.split(".")[1:])
    )
    assert private == []


HEAVY = ("mujoco", "faiss", "torch", "starlette", "uvicorn", "prometheus_client", "ray")


@pytest.mark.parametrize("package", ["knowledge", "federation"])
def test_the_core_packages_load_no_simulator_index_torch_or_server(package):
    """A robot that syncs its store never pays for MuJoCo, FAISS, torch or the server's libraries
    (the embodiment side and the server side load on first use)."""
    code = f"import sys, {package}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_sim_loads_torch_only_to_run_a_policy():
    """torch takes seconds to import (7 s on a loaded 2-core machine): `import sim`, a world's
    processes and `simnet world` do without it, and a policy built from a skill loads it."""
    code = (
        "import sys, sim, sim.world, sim.cli; before = 'torch' in sys.modules; "
        "sim.load_skill('arm_reach_good').module(); print(before, 'torch' in sys.modules, "
        "sim.MLP.__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True", "sim._torch_mlp"]


def test_the_graph_sees_the_imports_it_judges():
    """The checks above are only as good as the graph: it must hold the known arrows."""
    assert "knowledge" in _graph()["federation._auth"]
    assert "knowledge._kb" in _graph()["knowledge._home"]
    assert "sim.world._shards" in _graph()["sim.world._world"]
