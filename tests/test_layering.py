"""The layout holds: the runtime never imports pandas or the layers above it, and no module-level import cycles."""
import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
RUNTIME = ("communicator", "ops", "plan", "executor", "validate", "tuning", "errors", "sizes", "backends", "timing",
           "calibration", "consistency")
ABOVE = ("analysis", "bench", "cli", "verify", "e2e", "integrations")


def module_imports() -> dict[str, set[str]]:
    """dmacoll module -> the dmacoll modules it imports at load time (module level, not inside functions)."""
    graph = {}
    for path in (SRC / "dmacoll").rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = name if rel.name == "__init__" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                if base.startswith("dmacoll"):
                    deps |= {f"{base}.{a.name}" for a in node.names} | {base}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("dmacoll")}
        graph[name] = deps
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for d in graph[m]:
            if state.get(d) == "open":
                cycles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [m])
    # a package's __init__ naming its own submodules is not a cycle of code
    return [c for c in cycles if not all(b.startswith(c[0] + ".") or b == c[0] for b in c[1:])]


def test_no_module_level_import_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]  # the finder finds one
    assert find_cycles(module_imports()) == []


def layer(module: str) -> str:
    return (module.split(".") + [""])[1]


def test_the_runtime_imports_nothing_above_it():
    graph = module_imports()
    assert "dmacoll.ops" in graph["dmacoll.communicator"]  # the graph is read
    runtime = [m for m in graph if layer(m) in RUNTIME]
    above = {m: sorted(d for d in graph[m] if layer(d) in ABOVE) for m in runtime}
    assert runtime and not any(above.values()), {m: d for m, d in above.items() if d}


def test_the_runtime_does_not_load_pandas():
    code = ("import sys, dmacoll, dmacoll.communicator, dmacoll.ops, dmacoll.tuning, dmacoll.backends.host; "
            "from dmacoll import Communicator; assert 'pandas' not in sys.modules, 'pandas'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1000:]


def test_every_dmacoll_name_the_tests_import_exists():
    """Imports inside test functions (the GPU tests run only on GPU machines) name what the package has."""
    import importlib

    missing = []
    for path in sorted((SRC.parent / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dmacoll"):
                module = importlib.import_module(node.module)
                missing += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name) and importlib.util.find_spec(f"{node.module}.{a.name}")
                            is None]
    assert not missing, missing


def test_reading_results_does_not_load_torch():
    """The analysis (notebooks, `dmacoll report`) imports no torch until a computation needs an op spec."""
    code = ("import sys; import dmacoll_lab.analysis.docs, dmacoll_lab.analysis.claims, dmacoll_lab.analysis.c3_rules, "
            "dmacoll_lab.analysis.ficco_rules, dmacoll_lab.analysis.index_page; assert 'torch' not in sys.modules, 'torch'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1000:]
