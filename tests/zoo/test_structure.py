"""The import layers of README's "Architecture" section, checked on the source.

Imports inside functions count too: a lazy import that closes a cycle is still a cycle.
"""

import ast
from pathlib import Path

from tests.common import REPO

PACKAGE = REPO / "zoo"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict:
    """zoo module -> the zoo modules (and top-level packages) it imports."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:  # `from zoo import hub` imports the module zoo.hub
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in modules else node.module)
        graph[name] = {e for e in edges if e.split(".")[0] in ("zoo", "recipes") and e != name}
    return graph


def cycles(graph: dict) -> list:
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_zoo_never_imports_recipes():
    graph = import_graph()
    offenders = {m: sorted(e for e in edges if e.startswith("recipes")) for m, edges in graph.items()}
    assert not {m: e for m, e in offenders.items() if e}


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


LEAVES = ("zoo.recompute", "zoo.ordering")  # TensorFlow-only helpers the layers may use


def test_leaves_import_nothing_from_zoo():
    graph = import_graph()
    assert {leaf: graph[leaf] for leaf in LEAVES} == {leaf: set() for leaf in LEAVES}


def test_layers_import_only_layers_and_leaves():
    graph = import_graph()
    for module, edges in graph.items():
        if module.startswith("zoo.layers"):
            assert all(e.startswith("zoo.layers") or e in LEAVES for e in edges), (module, edges)


def test_import_zoo_makes_the_submodules_attributes():
    """`zoo.hub`, `zoo.export`, `zoo.generation` work after a bare `import zoo` (a fresh process)."""
    import subprocess
    import sys

    code = "import zoo; print(zoo.hub.load.__name__, zoo.export.saved_model.__name__, zoo.generation.generate.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.stdout.split() == ["load", "saved_model", "generate"], done.stderr[-1000:]
