"""The agent's import graph: no cycle, and each process side imports only its own side and the shared modules.

Read from the source (ast), every import counted, at the top of a module or
inside a function, except those under ``if TYPE_CHECKING:`` (never run).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sandboxd.agent
from sandboxd.pool import WARM_MODULES

AGENT = Path(sandboxd.agent.__file__).parent
PACKAGE = "sandboxd.agent"
# The entry point forks the zygote, then imports the host side: it is the one module that joins both.
LAUNCHER = f"{PACKAGE}.__main__"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(AGENT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, name: str, is_package: bool) -> set[str]:
    """Every module `source` (module `name`) imports when it runs, top level and in functions."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                visit(other)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            # `from package import module` imports the module.
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def agent_graph(root: Path = AGENT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package's import also runs its __init__)."""
    paths = {module_name(path): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges: set[str] = set()
        for target in imports_of(path.read_text(), name, path.name == "__init__.py"):
            # Importing a.b.c runs a, a.b and a.b.c: each that is one of ours is an edge.
            parts = target.split(".")
            for end in range(1, len(parts) + 1):
                prefix = ".".join(parts[:end])
                if prefix in paths and prefix != name and prefix.startswith(package):
                    edges.add(prefix)
        graph[name] = edges
    return graph


def _without_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the edges into a package's __init__ that every import of a submodule adds (they only
    run the __init__, whose own imports are edges of their own)."""
    packages = {name for name in graph if any(other.startswith(name + ".") for other in graph)}
    return {name: {target for target in targets if target not in packages} for name, targets in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as [a, b, ..., a], or [] if there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := walk(target)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            return cycle
    return []


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        node = todo.pop()
        for target in graph.get(node, ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def side(name: str) -> str:
    """host, forked, or shared (the package's top-level modules)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in ("host", "forked") else "shared"


GRAPH = _without_packages(agent_graph())
SOURCES = {module_name(path): path.read_text() for path in AGENT.rglob("*.py")}
PACKAGES = {module_name(path) for path in AGENT.rglob("__init__.py")}


def test_the_walk_finds_the_agents_modules_and_their_imports() -> None:
    """The checks below see the graph: the controller imports the runner, the zygote the worker."""
    assert f"{PACKAGE}.host.runner" in GRAPH[f"{PACKAGE}.host.controller"]
    assert f"{PACKAGE}.forked.worker" in GRAPH[f"{PACKAGE}.forked.zygote"]
    assert {side(name) for name in GRAPH} == {"host", "forked", "shared"}


def test_the_agent_has_no_import_cycle() -> None:
    assert find_cycle(GRAPH) == []


def test_a_cycle_through_an_import_inside_a_function_is_found() -> None:
    """What the agent had: worker imported judgeserver inside a function, which imported servers, which imported
    worker at the top."""
    modules = {
        "p.worker": "def main():\n    from p import judgeserver\n",
        "p.judgeserver": "from p.servers import serve_requests\n",
        "p.servers": "from typing import TYPE_CHECKING\nfrom p.worker import memory_bytes\n",
    }
    graph = {name: {target for target in imports_of(source, name, False) if target in modules}
             for name, source in modules.items()}
    assert find_cycle(graph) == ["p.judgeserver", "p.servers", "p.worker", "p.judgeserver"]
    modules["p.servers"] = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.worker import x\n"
    graph = {name: {target for target in imports_of(source, name, False) if target in modules}
             for name, source in modules.items()}
    assert find_cycle(graph) == []


@pytest.mark.parametrize("name", sorted(name for name in GRAPH if name != LAUNCHER))
def test_each_side_imports_only_itself_and_the_shared_modules(name: str) -> None:
    foreign = {target for target in GRAPH[name] if side(target) not in (side(name), "shared")}
    if side(name) == "shared":
        foreign = {target for target in GRAPH[name] if side(target) != "shared"}
    assert not foreign, f"{name} imports {sorted(foreign)}"


@pytest.mark.parametrize("name", sorted(name for name in GRAPH
                                        if side(name) in ("forked", "shared") and name != LAUNCHER))
def test_no_forked_process_imports_asyncio(name: str) -> None:
    """The zygote is forked before asyncio is imported (about 5 MB that every worker's fork would copy), and a
    forked process must not pull it in either: not in its own module, nor in any of the agent's it imports."""
    modules = {name} | reachable(GRAPH, name)
    importers = sorted(module for module in modules
                       if any(target.split(".")[0] == "asyncio"
                              for target in imports_of(SOURCES[module], module, module in PACKAGES)))
    assert not importers, f"{name} imports asyncio through {importers}"


# Modules a code zygote must not hold: asyncio (above); those whose extension libraries add mappings that
# every fork of it copies and every exit tears down (tempfile imports shutil, and that bz2 and lzma: 21 more
# mappings, about 0.2 ms more a forked job; hashlib maps OpenSSL's libcrypto); and those that register fork
# hooks, which run Python code in every worker it forks (threading's and logging's: about 150 page faults and
# 0.4 ms a worker; logging imports threading). random's hook stays: it is what reseeds each worker's generator.
NOT_IN_A_CODE_ZYGOTE = ("asyncio", "tempfile", "shutil", "bz2", "lzma", "hashlib", "threading", "logging")


@pytest.mark.parametrize("pool", ["python", "langs"])
def test_a_code_zygote_holds_none_of_the_costly_modules(pool: str) -> None:
    """What the zygote of a code sandbox imports, as it does it: its own module, then the pool's warm modules, each
    warmed (the harness's warm-up runs jobs of both its sides, and says on stderr if one failed)."""
    script = ("import json, sys\n"
              "from sandboxd.agent.forked import zygote\n"
              f"zygote._warm({WARM_MODULES[pool].split(',')!r})\n"
              f"print(json.dumps(sorted(set(sys.modules) & set({list(NOT_IN_A_CODE_ZYGOTE)!r}))))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == []
    assert done.stderr == ""
