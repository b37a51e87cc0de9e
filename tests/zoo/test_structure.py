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


# Who may import whom inside zoo (README: Architecture). A module of a group imports zoo modules of the
# groups listed only; export, generation, loading, hub and cli sit on top and may import any of these.
PURE = {"zoo.registry", "zoo.shapes", "zoo.checks", "zoo.files", "zoo.reading"}  # pure Python: no TF, no Keras
RULES = {
    **{module: PURE for module in PURE},
    "zoo.ops": {"zoo.ops"},  # TensorFlow-only tensor functions
    "zoo.layers": {"zoo.layers", "zoo.ops"},
    "zoo.training": {"zoo.training", "zoo.ops", "zoo.checks"},
    "zoo.models": {"zoo.models", "zoo.layers", "zoo.ops", "zoo.training", *PURE},
    "zoo.memory": {"zoo.memory", "zoo.ops", *PURE},
    # Keras optimizers: the private Keras API through zoo.training.keras_optimizer, their slots by the
    # optimizer table (zoo.memory.optimizer_state), stochastic rounding from zoo.ops. Nothing below imports
    # them: the fused update drives any Keras optimizer through the same adapter.
    "zoo.optimizers": {"zoo.optimizers", "zoo.ops", "zoo.training", "zoo.memory", *PURE},
}


def group(module: str):
    """The RULES key `module` belongs to (the longest matching package), or None."""
    keys = [k for k in RULES if module == k or module.startswith(k + ".")]
    return max(keys, key=len) if keys else None


def test_every_group_imports_only_what_its_rule_allows():
    graph = import_graph()
    broken = {}
    for module, edges in graph.items():
        rule = group(module)
        if rule is not None:
            bad = sorted(e for e in edges if e.startswith("zoo") and group(e) not in RULES[rule])
            if bad:
                broken[module] = bad
    assert broken == {}


def test_the_rules_catch_an_upward_import():
    graph = {"zoo.layers.block": {"zoo.models.base"}, "zoo.ops.x": {"zoo.layers.attention"}}
    assert [m for m, edges in graph.items() if any(group(e) not in RULES[group(m)] for e in edges)] == [
        "zoo.layers.block", "zoo.ops.x"]


def test_import_zoo_makes_the_submodules_attributes():
    """`zoo.hub`, `zoo.export`, `zoo.generation` work after a bare `import zoo` (a fresh process)."""
    import subprocess
    import sys

    code = "import zoo; print(zoo.hub.load.__name__, zoo.export.saved_model.__name__, zoo.generation.generate.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.stdout.split() == ["load", "saved_model", "generate"], done.stderr[-1000:]
