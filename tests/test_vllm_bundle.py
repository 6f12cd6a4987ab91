"""The vLLM bundle for GPU machines without network: resolution against the target's snapshot (a fake index of
tiny wheels here), the static import check, the pieces and the install script (run here, offline)."""
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import vllm_bundle as vb  # noqa: E402  (tools/vllm_bundle.py: a script of its own, not a module of either package)


def make_wheel(folder: Path, name: str, version: str, requires=(), modules=None) -> Path:
    """A minimal, installable wheel: METADATA, WHEEL, RECORD and one module per import name."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    files = {f"{m}/__init__.py": modules[m] if isinstance(modules, dict) else f"NAME = {name!r}\n"
             for m in (modules or [name.replace("-", "_")])}
    files[f"{dist}.dist-info/METADATA"] = ("Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                                           + "".join(f"Requires-Dist: {r}\n" for r in requires) + "\n")
    files[f"{dist}.dist-info/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


class Index:
    """name -> {version: (requires, modules)}; serves the newest version a specifier allows, like pip download."""

    def __init__(self, folder: Path, packages: dict):
        self.folder, self.packages, self.calls = folder, packages, []

    def __call__(self, name, spec):
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        self.calls.append((name, spec))
        versions = sorted((v for v in self.packages.get(name, {}) if SpecifierSet(spec).contains(Version(v), True)),
                          key=Version)
        if not versions:
            raise RuntimeError(f"no {name}{spec}")
        requires, modules = self.packages[name][versions[-1]]
        return make_wheel(self.folder, name, versions[-1], requires, modules)


def target(installed=None):
    return vb.Target("3.12.3", "2.39", "x86_64", installed or {"torch": "2.11.0", "numpy": "2.5.2"}, {}, "test")


def test_resolution_skips_what_the_target_has_and_what_is_left_out(tmp_path):
    index = Index(tmp_path, {
        "vllm": {"0.26.0": (["torch==2.11.0", "numpy", "fastapi[standard]>=0.1", "flashinfer-python==0.6",
                             "six; python_version > '3.11'", "colorama; sys_platform == 'win32'"], None)},
        "fastapi": {"0.2": (["starlette>=1", "uvicorn; extra == 'standard'", "httpx; extra == 'all'"], None)},
        "starlette": {"1.0": ([], None), "2.0": (["anyio"], None)},
        "anyio": {"4.0": ([], None)}, "uvicorn": {"0.3": ([], None)}, "six": {"1.17": ([], None)}})
    plan = vb.resolve("vllm==0.26.0", target(), index, {"flashinfer-python": "not imported"})
    assert sorted(plan.wheels) == ["anyio", "fastapi", "six", "starlette", "uvicorn", "vllm"]  # extra 'standard'
    assert plan.wheels["starlette"].version == "2.0" and plan.present == {"torch": "2.11.0", "numpy": "2.5.2"}
    assert plan.left_out == {"flashinfer-python": "not imported"} and plan.needed_by["uvicorn"] == ["fastapi"]
    assert not plan.shadows and ("flashinfer-python", "==0.6") not in index.calls


def test_a_conflict_excludes_the_newer_dependent_and_tries_again(tmp_path):
    """vLLM 0.26 pins apache-tvm-ffi==0.1.10; the newest xgrammar wants >=0.1.11: an older xgrammar is taken."""
    index = Index(tmp_path, {
        "vllm": {"0.26.0": (["xgrammar<1", "apache-tvm-ffi==0.1.10"], None)},
        "xgrammar": {"0.2.7": (["apache-tvm-ffi>=0.1.8"], None), "0.2.8": (["apache-tvm-ffi>=0.1.11"], None)},
        "apache-tvm-ffi": {"0.1.10": ([], None), "0.1.11": ([], None)}})
    plan = vb.resolve("vllm==0.26.0", target(), index, {})
    assert plan.wheels["xgrammar"].version == "0.2.7" and plan.wheels["apache-tvm-ffi"].version == "0.1.10"


def test_a_package_the_target_has_at_another_version_is_bundled_and_said_to_shadow(tmp_path):
    index = Index(tmp_path, {"vllm": {"0.26.0": (["numpy<2.4"], None)}, "numpy": {"2.3.5": ([], None)}})
    plan = vb.resolve("vllm==0.26.0", target(), index, {})
    assert plan.shadows == {"numpy": "2.5.2"} and plan.wheels["numpy"].version == "2.3.5"


def test_an_impossible_set_is_an_error(tmp_path):
    index = Index(tmp_path, {"vllm": {"0.26.0": (["a==1", "b"], None)}, "a": {"1": ([], None), "2": ([], None)},
                             "b": {"1": (["a>=2"], None)}})
    with pytest.raises(vb.Conflict, match=r"b: no wheel for the target satisfies !=1 \(after excluding b != 1\)"):
        vb.resolve("vllm==0.26.0", target(), index, {})


def test_markers_are_the_targets():
    t = target()
    m = t.markers("standard")
    assert m["python_version"] == "3.12" and m["extra"] == "standard" and m["sys_platform"] == "linux"
    args = t.pip_args()
    assert args[args.index("--python-version") + 1] == "3.12" and "manylinux_2_28_x86_64" in args
    assert "manylinux_2_39_x86_64" in args and "manylinux_2_40_x86_64" not in args and "cp312" in args


def test_the_shipped_target_snapshot():
    t = vb.Target.load(vb.TARGET_SNAPSHOT)
    assert t.python.startswith("3.12") and t.glibc == "2.39" and t.installed["torch"] == "2.11.0"
    assert t.provides("yaml") and t.provides("PIL") and t.provides("torch") and not t.provides("zmq")
    again = vb.from_freeze("\n".join(f"{k}=={v}" for k, v in t.installed.items()), t.python, t.glibc, t.machine,
                           t.source)
    assert json.loads(again.to_json()) == json.loads(vb.TARGET_SNAPSHOT.read_text())


def test_probe_describes_this_machine():
    t = vb.probe()
    assert t.python == ".".join(map(str, sys.version_info[:3])) and "pytest" in t.installed
    assert "pytest" in t.import_names["_pytest"] and t.provides("_pytest")


def fake_vllm(tmp_path, extra_import="") -> Path:
    modules = {"vllm": "import zmq\nimport numpy as np\nfrom vllm.engine import core\ntry:\n    import deep_ep\n"
                       "except ImportError:\n    pass\n",
               "vllm/engine": "from . import core\nif False:\n    import tilelang\n",
               "vllm/engine/core": f"import os, json\n{extra_import}\ndef f():\n    import flashinfer\n",
               "vllm/benchmarks": "", "vllm/benchmarks/latency": "import tqdm\n"}
    path = tmp_path / "vllm-0.26.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for m, text in modules.items():
            z.writestr(m + ("/__init__.py" if m.count("/") < 2 and m != "vllm/benchmarks/latency" else ".py"), text)
    return path


def test_static_import_check_sees_unconditional_module_level_imports_only(tmp_path):
    wheel = fake_vllm(tmp_path)
    found = vb.third_party_imports(wheel, ["vllm", "vllm.benchmarks.latency"])
    assert sorted(found) == ["numpy", "tqdm", "zmq"]  # not: the try / if False / in-function ones, nor stdlib
    assert found["zmq"] == ["vllm"]
    plan = vb.Plan({"pyzmq": vb.Wheel("pyzmq", "27", wheel, [], ["zmq"])}, {}, {}, {}, {})
    t = target({"numpy": "2", "tqdm": "4"})
    assert vb.third_party_imports(wheel) and vb.import_problems(plan, t, wheel) == []
    bad = fake_vllm(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path, "import cbor2\nimport tilelang")
    problems = vb.import_problems(plan, t, bad)
    assert any(p.startswith("cbor2 is imported by vllm.engine.core") for p in problems)
    assert any(p.startswith("tilelang (left out: TileLang") for p in problems)


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils")
def test_pieces_and_install_script_round_trip(tmp_path):
    index = Index(tmp_path / "idx", {"vllm": {"0.26.0": (["alpha"], ["vllm_fake"])},
                                     "alpha": {"1.0": ([], {"alpha": "X = 1\n" * 3000})}})
    (tmp_path / "idx").mkdir()
    plan = vb.resolve("vllm==0.26.0", target(), index, {})
    out = tmp_path / "bundle"
    m = vb.write_bundle(out, plan, target(), piece_bytes=4096, problems=[])
    assert len(m["pieces"]) >= 2 and all(p["bytes"] <= 4096 for p in m["pieces"])
    assert sorted(p.name for p in out.glob("part*")) == [p["file"] for p in m["pieces"]]
    assert [w["name"] for w in m["wheels"]] == ["alpha", "vllm"]
    site = tmp_path / "site"
    done = subprocess.run(["bash", str(out / "meta/install.sh"), str(out), str(site)], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installed 2 wheels (vllm 0.26.0)" in done.stdout  # the default root: vLLM
    assert (site / "alpha/__init__.py").exists() and (site / "vllm_fake/__init__.py").exists()
    assert (site / ".dmacoll_bundle").read_text().strip() == m["tar_sha256"]
    (out / m["pieces"][1]["file"]).write_bytes(b"x")  # a damaged piece stops the install before pip
    done = subprocess.run(["bash", str(out / "meta/install.sh"), str(out), str(tmp_path / "site2")],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert done.returncode != 0 and not (tmp_path / "site2").exists()


def test_any_root_requirement_bundles_what_the_target_lacks(tmp_path):
    index = Index(tmp_path / "idx", {"snakemake": {"9.27.1": (["yte", "numpy>=2"], None)},
                                     "yte": {"1.5": ([], None)}})
    (tmp_path / "idx").mkdir()
    snapshot = tmp_path / "t.json"
    snapshot.write_text(target().to_json())
    m = vb.build(tmp_path / "bundle", target_path=snapshot, fetch=index, root="snakemake==9.27.1")
    assert m["root"] == "snakemake==9.27.1" and [w["name"] for w in m["wheels"]] == ["snakemake", "yte"]
    assert "numpy" in m["on_target"] and "(snakemake==9.27.1)" in (tmp_path / "bundle/meta/install.sh").read_text()
    with pytest.raises(SystemExit):
        vb.main([str(tmp_path / "b2"), "--root", "snakemake", "--vllm", "0.26.0"])


def test_cli_probe_writes_a_snapshot(tmp_path, capsys):
    assert vb.main([str(tmp_path / "t.json"), "--probe"]) == 0
    assert vb.Target.load(tmp_path / "t.json").installed["pytest"]
    assert vb.tree_mib() > 1  # this checkout
