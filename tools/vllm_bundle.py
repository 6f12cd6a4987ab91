"""vLLM for a GPU machine without network: the vLLM wheel and exactly the wheels that machine lacks, in pieces
that fit one transfer, with a script that checks, joins and installs them there.

    python3 tools/vllm_bundle.py build/vllm_bundle             # on a machine with network (pip download)
    python3 tools/vllm_bundle.py build/snakemake_bundle --root snakemake==9.27.1   # any other requirement
    python3 tools/vllm_bundle.py lent-gpu.json --probe          # on the GPU machine: what it has installed

A script of its own (machine-setup logistics, not part of the library or the artifact): it needs `packaging` and
pip, nothing of dmacoll.

What goes in: vLLM's declared requirements (markers evaluated for the target: its Python, Linux x86_64), and
recursively theirs, resolved one at a time with ``pip download --no-deps`` for the target's Python and
platform tags, except (1) what the target already has at a version that satisfies (``envs/lent-gpu.json``, the
target's snapshot; ``--probe`` makes a new one there) and (2) ``LEFT_OUT``: packages vLLM declares but a
dummy-weight text model on CUDA does not import (each with its reason). A static check then reads the vLLM wheel:
every third-party module imported unconditionally at module level from the entry points a benchmark runs
(``ENTRY_MODULES``) must be on the target or in the bundle, and no left-out package may be among them. Imports
inside functions are not seen by that check: the run on the machine is the final test.

Out: ``OUT/partNN`` (a tar of the wheels, split into pieces of at most ``--piece-mib``), ``OUT/meta/`` with
``MANIFEST.json`` (every wheel with its sha256, size and who needs it; what the target has; what was left out)
and ``install.sh BUNDLE_DIR TARGET_DIR`` (checks every piece's sha256, joins them, checks the tar and every
wheel, ``pip install --no-deps --no-index --target TARGET_DIR``). Carry each piece in a call of its own to a
warm machine, then ``meta/`` (docs/e2e.md).
"""
from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

VLLM_VERSION = "0.26.0"  # the newest vLLM that pins torch 2.11.0, what the lent GPU machines have
ROOT = Path(__file__).resolve().parents[1]
TARGET_SNAPSHOT = ROOT / "envs/lent-gpu.json"
# a piece travels with the working tree in one call of at most 64 MiB: by default a piece takes what the tree leaves
# of 60 MiB (pieces of 42 MiB beside a 21 MiB tree were refused, 38 MiB went; the rest is the call's own)
CALL_MIB = 60
# what vLLM 0.26 declares and a dummy-weight Llama / Mixtral on CUDA never imports (VLLM_USE_FLASHINFER_SAMPLER=0)
LEFT_OUT = {
    "flashinfer-python": "FlashInfer: only for its sampler (off: VLLM_USE_FLASHINFER_SAMPLER=0) and the attention, "
                         "MoE and all-reduce backends that name it; Hopper's default attention is vLLM's own "
                         "FlashAttention",
    "tilelang": "TileLang kernels of sparse / quantized attention paths",
    "nvidia-cutlass-dsl": "CuTe-DSL kernels (FlashAttention 4, some MoE paths), several hundred MB",
    "quack-kernels": "CuTe-DSL kernels (needs nvidia-cutlass-dsl)",
    "tokenspeed-mla": "MLA attention kernels (DeepSeek-style models)",
    "humming-kernels": "quantized GEMM kernels",
    "nvidia-cudnn-frontend": "cuDNN attention backends (not chosen for these models)",
    "fastsafetensors": "--load-format fastsafetensors (the runs use dummy weights)",
    "torchcodec": "audio / video inputs",
    "pynvvideocodec": "video decoding",
    "mistral-common": "tokenizer_mode mistral (Mistral's own tokenizer files; the runs use tokenizer.json); on Python "
                      "3.12 it pins numpy<2.4 and would shadow the machine's numpy",
    "numba": "pinned ==0.65.0 while the machine has its own; imported only by n-gram speculative decoding and "
             "some multimodal processors",
    "setuptools": "pinned <81 while the machine has its own; vLLM never imports it at run time",
}
# where a benchmark run enters vLLM: the offline engine, its workers, the models, the collectives, the benchmarks
ENTRY_MODULES = (
    "vllm", "vllm.entrypoints.llm", "vllm.benchmarks.latency", "vllm.benchmarks.throughput",
    "vllm.v1.engine.core", "vllm.v1.engine.llm_engine", "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.model_executor.models.llama",
    "vllm.model_executor.models.mixtral", "vllm.model_executor.model_loader.dummy_loader",
    "vllm.v1.attention.backends.flash_attn", "vllm.distributed.device_communicators.cuda_communicator",
    "vllm.distributed.device_communicators.custom_all_reduce", "vllm.distributed.device_communicators.pynccl",
)
# import name -> distribution where they differ beyond case and - / _ (for a target snapshot without import names)
IMPORT_ALIASES = {"yaml": "pyyaml", "PIL": "pillow", "cv2": "opencv-python-headless", "google": "protobuf",
                  "cpuinfo": "py-cpuinfo", "zmq": "pyzmq", "pynvml": "nvidia-ml-py", "cuda": "cuda-bindings",
                  "attr": "attrs", "dateutil": "python-dateutil", "sklearn": "scikit-learn", "jwt": "pyjwt",
                  "dotenv": "python-dotenv", "multipart": "python-multipart", "pythonjsonlogger": "python-json-logger"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- the target machine ---------------------------------------------------------------------------------------------
@dataclass
class Target:
    python: str  # full version, e.g. 3.12.3
    glibc: str  # e.g. 2.39
    machine: str  # e.g. x86_64
    installed: dict[str, str]  # canonical distribution name -> version
    import_names: dict[str, list[str]] = field(default_factory=dict)  # import name -> distributions (probed)
    source: str = ""

    @classmethod
    def load(cls, path: str | Path) -> "Target":
        d = json.loads(Path(path).read_text())
        return cls(d["python"], d["glibc"], d["machine"], {canonical(k): v for k, v in d["installed"].items()},
                   d.get("import_names", {}), d.get("source", ""))

    def to_json(self) -> str:
        return json.dumps({"source": self.source, "python": self.python, "glibc": self.glibc,
                           "machine": self.machine, "installed": dict(sorted(self.installed.items())),
                           "import_names": dict(sorted(self.import_names.items()))}, indent=1) + "\n"

    def markers(self, extra: str = "") -> dict[str, str]:
        """PEP 508 marker values of the target (what pip evaluates there)."""
        return {"python_version": ".".join(self.python.split(".")[:2]), "python_full_version": self.python,
                "platform_machine": self.machine, "platform_system": "Linux", "sys_platform": "linux",
                "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython",
                "platform_release": "", "platform_version": "", "implementation_version": self.python,
                "extra": extra}

    def pip_args(self) -> list[str]:
        """``pip download`` flags selecting wheels the target can install (its manylinux tags, newest first)."""
        major, minor = (int(x) for x in self.glibc.split(".")[:2])
        tags = [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, 16, -1)]
        tags += [f"manylinux2014_{self.machine}", f"manylinux2010_{self.machine}", f"manylinux1_{self.machine}",
                 f"linux_{self.machine}"]
        py = "".join(self.python.split(".")[:2])
        return (["--only-binary=:all:", "--python-version", ".".join(self.python.split(".")[:2]),
                 "--implementation", "cp", "--abi", f"cp{py}", "--abi", "abi3", "--abi", "none"]
                + [arg for t in tags for arg in ("--platform", t)])

    def provides(self, module: str) -> bool:
        """Whether an import name is one of the target's installed distributions."""
        if module in self.import_names:
            return True
        return canonical(IMPORT_ALIASES.get(module, module)) in self.installed


def probe() -> Target:
    """This machine as a target: its Python, glibc and every distribution it can import (run it there)."""
    import platform
    from importlib import metadata

    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    names = {k: sorted({canonical(x) for x in v}) for k, v in metadata.packages_distributions().items()}
    return Target(platform.python_version(), platform.libc_ver()[1] or "0.0", platform.machine(), installed,
                  names, f"tools/vllm_bundle.py --probe on {platform.node()} ({sys.executable})")


def from_freeze(text: str, python: str, glibc: str, machine: str, source: str) -> Target:
    """A target from ``pip freeze`` output (no import names: ``provides`` then goes by names and aliases)."""
    installed = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            installed[canonical(name)] = version.strip()
    return Target(python, glibc, machine, installed, {}, source)


# -- wheels ----------------------------------------------------------------------------------------------------------
@dataclass
class Wheel:
    name: str  # canonical
    version: str
    path: Path
    requires: list[str]  # Requires-Dist lines
    top_level: list[str]  # import names it provides
    sha256: str = ""
    size: int = 0


def read_wheel(path: str | Path) -> Wheel:
    path = Path(path)
    with zipfile.ZipFile(path) as z:
        info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        meta = z.read(info).decode()
        record = z.read(info.replace("METADATA", "RECORD")).decode()
    fields = [line.split(":", 1) for line in meta.split("\n\n")[0].splitlines() if ":" in line]
    name = next(v.strip() for k, v in fields if k == "Name")
    version = next(v.strip() for k, v in fields if k == "Version")
    requires = [v.strip() for k, v in fields if k == "Requires-Dist"]
    tops = set()
    for row in record.splitlines():
        first = row.split(",")[0].split("/")[0]
        if first.endswith((".dist-info", ".data")) or not first:
            continue
        tops.add(first.split(".")[0] if first.endswith((".py", ".so", ".pyd")) else first)
    return Wheel(canonical(name), version, path, requires, sorted(tops), sha256_of(path), path.stat().st_size)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class PipFetcher:
    """The newest wheel of a requirement for the target: ``pip download --no-deps`` into a cache folder; where only
    a source distribution is published, a wheel built here, if it is pure Python (``-none-any``)."""

    def __init__(self, target: Target, cache: Path, pip: Optional[list[str]] = None):
        self.target, self.cache = target, Path(cache)
        self.pip = pip or [sys.executable, "-m", "pip"]
        self.cache.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: str, specifier: str) -> Path:
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            cmd = self.pip + ["download", "--no-deps", "--disable-pip-version-check", "-q", "-d", tmp,
                              *self.target.pip_args(), f"{name}{specifier}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            got = list(Path(tmp).glob("*.whl"))
            if done.returncode or len(got) != 1:  # no wheel published: one built here, if pure Python (any target)
                built = subprocess.run(self.pip + ["wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w",
                                                   tmp, f"{name}{specifier}"], capture_output=True, text=True)
                got = [w for w in Path(tmp).glob("*.whl") if w.name.endswith("-none-any.whl")]
                if built.returncode or len(got) != 1:
                    raise RuntimeError(f"pip download {name}{specifier} for the target failed, and no pure-Python "
                                       f"wheel could be built:\n{done.stderr[-1500:]}\n{built.stderr[-500:]}")
            final = self.cache / got[0].name
            os.replace(got[0], final)
            return final


# -- resolution --------------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    wheels: dict[str, Wheel]  # to bundle
    present: dict[str, str]  # on the target already, at a version that satisfies
    left_out: dict[str, str]  # declared but not bundled: name -> reason
    needed_by: dict[str, list[str]]  # name -> who asked for it
    shadows: dict[str, str]  # bundled although the target has another version: name -> the target's version


class Conflict(RuntimeError):
    """No wheel satisfies what ``parents`` ask of ``name`` together."""

    def __init__(self, name: str, parents: list[tuple[str, str, str]], why: str):
        super().__init__(f"{name}: {why}; asked for by " + ", ".join(f"{p} {v} ({s or 'any'})" for p, v, s in parents))
        self.name, self.parents = name, parents


def resolve(root: str, target: Target, fetch: Callable[[str, str], Path], left_out: dict[str, str],
            rounds: int = 40) -> Plan:
    """The wheels ``root`` needs on ``target``. Greedy (newest wheel first), breadth first; where two
    requirements cannot both be met, the newest package that asked last is excluded at its chosen version and the
    resolution starts again (a small form of pip's backtracking). At the end every bundled wheel's requirements
    are checked against the bundle, the target and the left-out list."""
    excluded: dict[str, set[str]] = {}
    memo: dict[tuple[str, str], Wheel] = {}

    def cached(name: str, spec: str) -> Wheel:
        if (name, spec) not in memo:
            memo[(name, spec)] = read_wheel(fetch(name, spec))
        return memo[(name, spec)]

    from packaging.requirements import Requirement

    fixed = canonical(Requirement(root).name)  # the root's version is asked for: never excluded
    for _ in range(rounds):
        try:
            plan = _resolve_once(root, target, cached, left_out, excluded)
        except Conflict as c:
            movable = [(p, v) for p, v, _ in c.parents if p not in ("(bundle)", fixed) and v]
            if not movable:
                tried = "; ".join(f"{n} != {', '.join(sorted(v))}" for n, v in excluded.items())
                raise Conflict(c.name, c.parents, str(c).split(";")[0].split(": ", 1)[1]
                               + (f" (after excluding {tried})" if tried else "")) from c
            parent, version = movable[-1]
            excluded.setdefault(parent, set()).add(version)
            continue
        problems = unmet(plan, target)
        if problems:
            raise RuntimeError("the bundle would not satisfy its own requirements:\n  " + "\n  ".join(problems))
        return plan
    raise RuntimeError(f"no consistent set of wheels after {rounds} exclusions: {excluded}")


def _resolve_once(root: str, target: Target, fetch: Callable[[str, str], Wheel], left_out: dict[str, str],
                  excluded: dict[str, set[str]]) -> Plan:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    wheels: dict[str, Wheel] = {}
    present: dict[str, str] = {}
    hit: dict[str, str] = {}
    needed_by: dict[str, list[str]] = {}
    asks: dict[str, list[tuple[str, str, str]]] = {}  # name -> (parent, parent's version, specifier)
    specs: dict[str, SpecifierSet] = {}
    extras_done: dict[str, set[str]] = {}
    queue: list[tuple[str, str, str]] = [(root, "(bundle)", "")]

    def enqueue(w: Wheel, extras: Iterable[str]) -> None:
        for line in w.requires:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate(target.markers(e)) for e in ["", *extras]):
                queue.append((line, w.name, w.version))

    def choose(name: str) -> Wheel:
        spec = specs[name] & SpecifierSet(",".join(f"!={v}" for v in sorted(excluded.get(name, ()))))
        try:
            w = fetch(name, str(spec))
        except RuntimeError as e:
            raise Conflict(name, asks[name], f"no wheel for the target satisfies {spec}") from e
        if not spec.contains(Version(w.version), prereleases=True):
            raise Conflict(name, asks[name], f"pip chose {w.version}, which is not {spec}")
        return w

    while queue:
        line, parent, parent_version = queue.pop(0)
        req = Requirement(line)
        name = canonical(req.name)
        needed_by.setdefault(name, [])
        if parent not in needed_by[name]:
            needed_by[name].append(parent)
        if name in left_out:
            hit[name] = left_out[name]
            continue
        asks.setdefault(name, []).append((parent, parent_version, str(req.specifier)))
        specs[name] = specs.get(name, SpecifierSet()) & req.specifier
        have = target.installed.get(name)
        if have is not None and specs[name].contains(Version(have), prereleases=True) \
                and have not in excluded.get(name, ()):
            present[name] = have
            wheels.pop(name, None)
            if req.extras and not set(req.extras) <= extras_done.get(name, set()):
                # the target's copy has the package; its extras' requirements still have to be there
                extras_done.setdefault(name, set()).update(req.extras)
                enqueue(fetch(name, f"=={have}"), req.extras)
            continue
        w = wheels.get(name)
        if w is None or not specs[name].contains(Version(w.version), prereleases=True):
            w = choose(name)
            wheels[name] = w
            present.pop(name, None)
            extras_done[name] = set(req.extras)
            enqueue(w, req.extras)
        elif not set(req.extras) <= extras_done[name]:
            extras_done[name] |= set(req.extras)
            enqueue(w, req.extras)
    shadows = {n: target.installed[n] for n in wheels if n in target.installed}
    return Plan(wheels, present, hit, needed_by, shadows)


def unmet(plan: Plan, target: Target) -> list[str]:
    """Requirements of bundled wheels that neither the bundle nor the target satisfies (left-out ones excepted)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    versions = {**{n: v for n, v in target.installed.items()}, **{n: w.version for n, w in plan.wheels.items()}}
    out = []
    for w in plan.wheels.values():
        for line in w.requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(target.markers("")):
                continue  # extras' requirements were followed where an extra was asked for
            name = canonical(req.name)
            if name in plan.left_out:
                continue
            got = versions.get(name)
            if got is None or not req.specifier.contains(Version(got), prereleases=True):
                out.append(f"{w.name} {w.version} needs {line}; has {got or 'nothing'}")
    return out


# -- the static import check -----------------------------------------------------------------------------------------
def module_imports(source: str, module: str, is_package: bool) -> tuple[list[str], list[str]]:
    """(unconditional, conditional) absolute names imported at module level. Conditional: inside ``if`` (not
    ``TYPE_CHECKING``, which never runs) or ``try`` blocks; imports inside functions and classes are not seen."""
    package = module if is_package else module.rpartition(".")[0]
    sure: list[str] = []
    maybe: list[str] = []

    def names(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        return [base] + [f"{base}.{a.name}" for a in node.names]

    def visit(body, conditional: bool) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                (maybe if conditional else sure).extend(names(node))
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body, True)
                    visit(node.orelse, True)
            elif isinstance(node, ast.Try):
                visit(node.body, True)
                for h in node.handlers:
                    visit(h.body, True)
                visit(node.orelse, True)
                visit(node.finalbody, conditional)
            elif isinstance(node, ast.With):
                visit(node.body, conditional)

    visit(ast.parse(source).body, False)
    return sure, maybe


def third_party_imports(wheel: Path, entries: Iterable[str] = ENTRY_MODULES) -> dict[str, list[str]]:
    """Top-level third-party modules imported unconditionally at load time from ``entries`` inside the vLLM
    wheel, each with the first vLLM modules that import it."""
    stdlib = set(sys.stdlib_module_names)
    sources: dict[str, tuple[str, bool]] = {}
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if n.startswith("vllm/") and n.endswith(".py"):
                parts = n[:-3].split("/")
                package = parts[-1] == "__init__"
                sources[".".join(parts[:-1] if package else parts)] = (z.read(n).decode(errors="replace"),
                                                                       package)
    seen: set[str] = set()
    stack: list[str] = []
    found: dict[str, list[str]] = {}

    def add(name: str) -> None:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            m = ".".join(parts[:i])
            if m in sources and m not in seen:
                seen.add(m)
                stack.append(m)

    for e in entries:
        add(e)
    while stack:
        m = stack.pop()
        sure, _ = module_imports(sources[m][0], m, sources[m][1])
        for name in sure:
            top = name.split(".")[0]
            if top == "vllm":
                add(name)
            elif top and top not in stdlib:
                found.setdefault(top, [])
                if len(found[top]) < 3:
                    found[top].append(m)
    return dict(sorted(found.items()))


def import_problems(plan: Plan, target: Target, vllm_wheel: Path) -> list[str]:
    """Modules the entry points import at load time that neither the target nor the bundle provides, and
    left-out packages they import."""
    bundled = {t for w in plan.wheels.values() for t in w.top_level}
    left = {canonical(n) for n in plan.left_out} | {canonical(n) for n in LEFT_OUT}
    out = []
    for module, where in third_party_imports(vllm_wheel).items():
        dist = canonical(IMPORT_ALIASES.get(module, module))
        if dist in left and module not in bundled:
            out.append(f"{module} (left out: {LEFT_OUT.get(dist, '')}) is imported by {', '.join(where)}")
        elif module not in bundled and not target.provides(module):
            out.append(f"{module} is imported by {', '.join(where)} and is neither on the target nor bundled")
    return out


# -- the bundle on disk ------------------------------------------------------------------------------------------------
INSTALL_SH = r'''#!/usr/bin/env bash
# Check, join and install this vLLM bundle (written by `tools/vllm_bundle.py`; MANIFEST.json says what is in it).
# Usage (on the target machine): bash install.sh BUNDLE_DIR TARGET_DIR   (then PYTHONPATH=TARGET_DIR:...)
set -euo pipefail
bundle=${1:?bundle dir (the partNN pieces)}; target=${2:?install into}
py=${PYTHON:-python3}
cd "$bundle"
echo "checking __NPIECES__ pieces"
sha256sum -c --quiet <<'SUMS'
__PIECE_SUMS__
SUMS
work=$(mktemp -d "${TMPDIR:-/tmp}/vllm_bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat __PIECES__ > "$work/bundle.tar"
echo "__TAR_SHA__  $work/bundle.tar" | sha256sum -c --quiet
tar -xf "$work/bundle.tar" -C "$work"
(cd "$work/wheels" && sha256sum -c --quiet ../wheels.sha256)
mkdir -p "$target"
"$py" -m pip install --no-deps --no-index --disable-pip-version-check -q --target "$target" "$work"/wheels/*.whl
echo "__TAR_SHA__" > "$target/.dmacoll_bundle"
echo "installed __NWHEELS__ wheels (__ROOT__) into $target"
'''


def write_bundle(out: Path, plan: Plan, target: Target, piece_bytes: int, problems: list[str],
                 root: Optional[str] = None) -> dict:
    """The pieces, MANIFEST.json and install.sh; returns the manifest (``root``: the requirement bundled, for
    its messages; default: vLLM's)."""
    out = Path(out)
    (out / "meta").mkdir(parents=True, exist_ok=True)
    for old in out.glob("part*"):
        old.unlink()
    wheels = sorted(plan.wheels.values(), key=lambda w: w.name)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        sums = "".join(f"{w.sha256}  {w.path.name}\n" for w in wheels).encode()
        _add(tar, "wheels.sha256", sums)
        for w in wheels:
            _add(tar, f"wheels/{w.path.name}", w.path.read_bytes())
    data = buf.getvalue()
    pieces = []
    for i in range(0, len(data), piece_bytes):
        name = f"part{len(pieces):02d}"
        (out / name).write_bytes(data[i:i + piece_bytes])
        pieces.append({"file": name, "bytes": len(data[i:i + piece_bytes]),
                       "sha256": hashlib.sha256(data[i:i + piece_bytes]).hexdigest()})
    tar_sha = hashlib.sha256(data).hexdigest()
    vllm = plan.wheels["vllm"].version if "vllm" in plan.wheels else "?"
    root = root or f"vllm {vllm}"
    manifest = {
        "created_by": "tools/vllm_bundle.py", "root": root, "vllm": vllm,
        "target": {"python": target.python, "glibc": target.glibc, "machine": target.machine,
                   "snapshot": target.source},
        "tar_sha256": tar_sha, "tar_bytes": len(data), "pieces": pieces,
        "wheels": [{"file": w.path.name, "name": w.name, "version": w.version, "bytes": w.size, "sha256": w.sha256,
                    "needed_by": plan.needed_by.get(w.name, []),
                    **({"shadows_installed": plan.shadows[w.name]} if w.name in plan.shadows else {})}
                   for w in wheels],
        "on_target": dict(sorted(plan.present.items())), "left_out": dict(sorted(plan.left_out.items())),
        "import_check": problems or "every module the entry points import at load time is on the target or here",
    }
    (out / "meta/MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    script = (INSTALL_SH.replace("__PIECE_SUMS__", "\n".join(f"{p['sha256']}  {p['file']}" for p in pieces))
              .replace("__PIECES__", " ".join(p["file"] for p in pieces)).replace("__TAR_SHA__", tar_sha)
              .replace("__NPIECES__", str(len(pieces))).replace("__NWHEELS__", str(len(wheels)))
              .replace("__ROOT__", root))
    (out / "meta/install.sh").write_text(script)
    return manifest


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def build(out: str | Path, version: Optional[str] = None, target_path: Optional[str | Path] = None,
          piece_mib: Optional[int] = None, cache: Optional[str | Path] = None,
          fetch: Optional[Callable[[str, str], Path]] = None, root: Optional[str] = None) -> dict:
    """Resolve, check and write the bundle (module docstring); None: the defaults. ``root``: a requirement other
    than vLLM (e.g. ``snakemake==9.27.1``, for the workflow on the lent machines): everything it needs that the
    target lacks, nothing left out, no import check (that one reads vLLM's entry points)."""
    target = Target.load(target_path or TARGET_SNAPSHOT)
    out = Path(out)
    fetch = fetch or PipFetcher(target, Path(cache or out.parent / f"{out.name}_cache"))  # not carried
    if root is not None:
        plan, problems = resolve(root, target, fetch, {}), ["not run: the bundle is not vLLM"]
    else:
        plan = resolve(f"vllm=={version or VLLM_VERSION}", target, fetch, LEFT_OUT)
        problems = import_problems(plan, target, plan.wheels["vllm"].path)
        if problems:
            raise RuntimeError("vLLM would not import on the target:\n  " + "\n  ".join(problems))
    return write_bundle(out, plan, target, (piece_mib or default_piece_mib()) << 20, problems, root)


def default_piece_mib(root: Path = ROOT) -> int:
    """The largest piece that travels beside this working tree (``CALL_MIB``), at least 8 MiB."""
    return max(8, int(CALL_MIB - tree_mib(root)))


def tree_mib(root: Path = ROOT) -> float:
    """MiB of the working tree that travels to a device with each call (tracked and untracked-not-ignored)."""
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True, text=True)
    files = [root / f for f in done.stdout.split("\0") if f]
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="tools/vllm_bundle.py", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the bundle folder (partNN + meta/); with --probe: the snapshot file to write")
    p.add_argument("--probe", action="store_true", help="write this machine's snapshot (python, glibc, installed "
                                                        "packages) to OUT instead; run it on the GPU machine")
    p.add_argument("--vllm", default=None, help="vLLM version (default: the newest that pins torch 2.11.0)")
    p.add_argument("--root", default=None, help="bundle this requirement instead of vLLM (e.g. snakemake==9.27.1)")
    p.add_argument("--target", default=None, help="the target's snapshot (default: envs/lent-gpu.json)")
    p.add_argument("--piece-mib", type=int, default=None, help="MiB per piece (default: what the working tree "
                                                                 f"leaves of {CALL_MIB} MiB)")
    p.add_argument("--cache", default=None, help="where downloaded wheels are kept (default: OUT_cache beside OUT)")
    a = p.parse_args(argv)
    if a.piece_mib is not None and a.piece_mib <= 0:
        p.error(f"--piece-mib must be positive: {a.piece_mib}")
    if a.probe:
        Path(a.out).write_text(probe().to_json())
        print(f"wrote {a.out}")
        return 0
    if a.root is not None and a.vllm is not None:
        p.error("--root and --vllm: one or the other")
    m = build(a.out, a.vllm, a.target, a.piece_mib, a.cache, root=a.root)
    pieces = ", ".join(f"{x['file']} {x['bytes'] / 2**20:.1f} MiB" for x in m["pieces"])
    print(f"{a.out}: {m['root']} and {len(m['wheels']) - 1} wheels the target lacks, {m['tar_bytes'] >> 20} MiB "
          f"in {len(m['pieces'])} pieces: {pieces}")
    print(f"left out: {', '.join(m['left_out'])}; import check: {m['import_check']}")
    print(f"each call carries one piece + the working tree ({tree_mib():.1f} MiB): keep both under 64 MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
