"""The layout holds: two packages in src/, the library (dmacoll) and the artifact around it (dmacoll_lab). The
library never imports the artifact or the artifact's dependencies, and works without them; the runtime imports
nothing above it; no two modules import each other. Every import of a module is read, those inside functions too."""
import ast
import importlib
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LIBRARY, ARTIFACT = "dmacoll", "dmacoll_lab"
RUNTIME = ("communicator", "ops", "plan", "executor", "validate", "options", "tuning", "errors", "sizes", "backends",
           "timing", "graphs", "calibration", "consistency", "nccl_path", "cache_dir")
# what the artifact's extras install (pyproject: lab, workflow, vllm): the library imports none of it, except the
# vLLM plugin, which imports vLLM inside the functions that vLLM calls
ARTIFACT_DEPENDENCIES = ("pandas", "yaml", "packaging", "seaborn", "matplotlib", "snakemake", "papermill",
                         "IPython", "vllm")
PLUGIN = "dmacoll.integrations.vllm"


def modules() -> dict[str, Path]:
    """Every module of the two packages, by name."""
    out = {}
    for top in (LIBRARY, ARTIFACT):
        for path in (SRC / top).rglob("*.py"):
            rel = path.relative_to(SRC).with_suffix("")
            out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


def imports(path: Path, package: str, known: set[str]) -> set[str]:
    """Every module ``path`` imports, anywhere in it (module level, functions, classes), as absolute names:
    ``from X import a`` is X.a where that is a module of ``known``, else X."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def module_imports() -> dict[str, set[str]]:
    """Module of either package -> every import it makes (absolute names, third-party ones included)."""
    known = modules()
    return {name: imports(path, name if path.name == "__init__.py" else name.rsplit(".", 1)[0], set(known))
            for name, path in known.items()}


def internal(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the packages' own modules."""
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                cycles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    # a package's __init__ naming its own submodules is not a cycle of code
    return [c for c in cycles if not all(b.startswith(c[0] + ".") or b == c[0] for b in c[1:])]


def test_the_reader_sees_imports_inside_functions(tmp_path):
    (tmp_path / "m.py").write_text("from . import a\n\ndef f():\n    from .b import c\n    import d.e\n")
    assert imports(tmp_path / "m.py", "pkg", {"pkg.a", "pkg.b"}) == {"pkg.a", "pkg.b", "d.e"}
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]  # the finder finds one


def test_no_import_cycles():
    graph = internal(module_imports())
    assert "dmacoll_lab.e2e.bench" in graph["dmacoll_lab.cli.e2e"]  # imported inside cmd_e2e: read too
    assert find_cycles(graph) == []


def test_the_library_never_imports_the_artifact():
    graph = module_imports()
    library = [m for m in graph if m.split(".")[0] == LIBRARY]
    assert "dmacoll.ops" in graph["dmacoll.communicator"] and PLUGIN in library  # the graph is read
    up = {m: sorted(d for d in graph[m] if d.split(".")[0] == ARTIFACT) for m in library}
    assert not any(up.values()), {m: d for m, d in up.items() if d}


def test_the_library_imports_none_of_the_artifacts_dependencies():
    graph = module_imports()
    found = {m: sorted(d for d in deps if d.split(".")[0] in ARTIFACT_DEPENDENCIES and not
                       (m == PLUGIN and d.split(".")[0] == "vllm"))
             for m, deps in graph.items() if m.split(".")[0] == LIBRARY}
    assert any(d.startswith("vllm") for d in graph[PLUGIN])  # the plugin's own imports are read
    assert not any(found.values()), {m: d for m, d in found.items() if d}


SURFACE = "dmacoll.lab_api"  # the library's names the lab uses beyond dmacoll.__all__, listed once


def test_the_lab_imports_only_the_public_api_and_the_named_surface():
    """The artifact reaches the library through ``dmacoll`` (its ``__all__``) and ``dmacoll.lab_api`` only, and the
    library itself never imports that surface (it is the lab's)."""
    import dmacoll

    wrong = []
    for top in (SRC / ARTIFACT, SRC.parent / "notebooks"):
        for path in sorted(top.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    wrong += [f"{path.name}: import {a.name}" for a in node.names if a.name.split(".")[0] == LIBRARY]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == LIBRARY:
                    wrong += [f"{path.name}: from dmacoll import {a.name}" for a in node.names
                              if a.name not in dmacoll.__all__]
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(LIBRARY + ".") \
                        and node.module != SURFACE:
                    wrong.append(f"{path.name}: from {node.module}")
    assert not wrong, wrong
    graph = module_imports()
    assert SURFACE in graph["dmacoll_lab.cli.bench"]  # the graph sees the lab's imports of it
    assert not [m for m in graph if m.split(".")[0] == LIBRARY and SURFACE in graph[m]]


def test_the_surface_names_resolve_to_the_library_objects():
    """Each name is the library's object; a module's view holds exactly its listed names, none private."""
    from dmacoll import lab_api

    for name in lab_api.__all__:
        module, attribute = lab_api._SURFACE[name]
        loaded = importlib.import_module(module)
        got = getattr(lab_api, name)
        assert not name.startswith("_") or name == "__version__", name
        if attribute is not None:
            assert got is getattr(loaded, attribute), name
            continue
        listed = lab_api._VIEWS[name]
        assert sorted(vars(got)) == sorted(listed) and not [n for n in listed if n.startswith("_")], name
        assert all(getattr(got, n) is getattr(loaded, n) for n in listed), name
    for missing in (lambda: lab_api.not_a_name, lambda: lab_api.cuda_sm.source):  # unlisted: not reachable
        try:
            missing()
        except AttributeError as e:
            assert "not_a_name" in str(e) or "source" in str(e)
        else:
            raise AssertionError("an unlisted name must raise AttributeError")


def _lab_view_uses() -> tuple[dict, set]:
    """(per view of the surface, the names the lab's source reads of it), and every surface name it imports."""
    from dmacoll import lab_api

    uses: dict[str, set] = {name: set() for name in lab_api._VIEWS}
    imported: set = set()
    for top in (SRC / ARTIFACT, SRC.parent / "notebooks"):
        for path in sorted(top.rglob("*.py")):
            tree = ast.parse(path.read_text())
            aliases = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == SURFACE:
                    imported |= {a.name for a in node.names}
                    aliases.update({a.asname or a.name: a.name for a in node.names if a.name in lab_api._VIEWS})
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                    uses[aliases[node.value.id]].add(node.attr)
    return uses, imported


def test_the_lab_reads_exactly_the_names_each_view_lists():
    """The lists are the boundary: a name the lab reads of a view is listed (else it fails at run time, maybe only
    on a GPU), and a listed name the lab no longer reads is taken off; every surface name is imported somewhere."""
    from dmacoll import lab_api

    uses, imported = _lab_view_uses()
    assert {name: sorted(used) for name, used in uses.items()} == \
        {name: sorted(listed) for name, listed in lab_api._VIEWS.items()}
    assert not set(lab_api.__all__) - imported, sorted(set(lab_api.__all__) - imported)


def layer(module: str) -> str:
    return (module.split(".") + [""])[1]


def test_the_runtime_imports_nothing_above_it():
    """The runtime (communicator down to the backends) knows nothing of the plugin on top of it."""
    graph = internal(module_imports())
    runtime = [m for m in graph if m.split(".")[0] == LIBRARY and layer(m) in RUNTIME]
    above = {m: sorted(d for d in graph[m] if d.split(".")[0] != LIBRARY or layer(d) not in RUNTIME + ("",))
             for m in runtime}
    assert runtime and not any(above.values()), {m: d for m, d in above.items() if d}


def test_the_library_works_without_the_artifact_and_its_dependencies(tmp_path):
    """A fresh interpreter in which the artifact, pandas, pyyaml, seaborn, snakemake, vLLM, ... cannot be
    imported: every module of dmacoll imports, and two ranks run collectives on the host backend
    (tests/library_alone.py)."""
    script = Path(__file__).with_name("library_alone.py")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.count(": ok") == 2, done.stdout[-2000:] + done.stderr[-3000:]


def test_the_cli_without_the_lab_extra_says_so_in_one_line(tmp_path):
    """`dmacoll --help` works without pandas; a command that needs it says which extra to install."""
    guard = ("import importlib.abc, sys\n"
             "class R(importlib.abc.MetaPathFinder):\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] == 'pandas':\n"
             "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
             "sys.meta_path.insert(0, R())\n"
             "from dmacoll_lab.cli import main\n")
    csv = tmp_path / "sweep.csv"
    csv.write_text("op\n")
    helped = subprocess.run([sys.executable, "-c", guard + "main(['--help'])"], capture_output=True, text=True)
    assert helped.returncode == 0 and "vllm" in helped.stdout, helped.stderr[-2000:]
    done = subprocess.run([sys.executable, "-c", guard + f"sys.exit(main(['report', 'table', '--csv', {str(csv)!r}]))"],
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == ("dmacoll report: needs pandas, which dmacoll-lab installs (from the repository "
                                   "root: pip install -e './lab')"), done.stderr[-2000:]


def test_two_distributions_one_package_each(tmp_path):
    """pyproject.toml builds the library (dmacoll) alone, lab/pyproject.toml the artifact (dmacoll-lab, with the
    `dmacoll` command), which requires the library at the same version."""
    import pytest

    pytest.importorskip("setuptools", reason="building without isolation needs setuptools in this environment")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp_path), str(SRC.parent), str(SRC.parent / "lab")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    import zipfile

    tops = {}
    for wheel in tmp_path.glob("*.whl"):
        names = zipfile.ZipFile(wheel).namelist()
        dist = wheel.name.split("-")[0]
        tops[dist] = {n.split("/")[0] for n in names if ".dist-info" not in n.split("/")[0]}
        meta = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        if dist == "dmacoll_lab":
            assert "Requires-Dist: dmacoll==0.1.0" in meta
            points = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith("entry_points.txt"))
            assert "dmacoll = dmacoll_lab.cli:main" in points
    assert tops == {"dmacoll": {LIBRARY}, "dmacoll_lab": {ARTIFACT}}, tops


def test_every_dmacoll_name_the_tests_import_exists():
    """Imports inside test functions (the GPU tests run only on GPU machines) name what the packages have."""
    import importlib

    missing = []
    for path in sorted((SRC.parent / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (LIBRARY, ARTIFACT):
                module = importlib.import_module(node.module)
                missing += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name) and importlib.util.find_spec(f"{node.module}.{a.name}")
                            is None]
    assert not missing, missing


def test_reading_results_does_not_load_torch():
    """The analysis (notebooks, `dmacoll report`) imports no torch until a computation needs an op spec."""
    code = ("import sys; import dmacoll_lab.analysis.docs, dmacoll_lab.analysis.claims, "
            "dmacoll_lab.analysis.c3_rules, dmacoll_lab.analysis.ficco_rules, dmacoll_lab.analysis.index_page; "
            "assert 'torch' not in sys.modules, 'torch'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1000:]


def test_the_calibration_never_builds_a_communicator():
    """The communicator that calibrates makes the one its candidates are timed on and hands it over
    (``lookup.calibrate``'s ``measuring``): no calibration module constructs one (it used to, as ``type(comm)(...)``
    inside the constructor, a dependency no import graph shows)."""
    for path in sorted((SRC / "dmacoll" / "calibration").glob("*.py")):
        text = path.read_text()
        assert "type(comm)(" not in text and "Communicator(" not in text.replace("``Communicator(", ""), path
