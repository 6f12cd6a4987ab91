"""The kernels' cubins are kept in dmacoll's cache directory: a process after the first loads them instead of running
NVRTC; anything that makes a cubin (source, name, architecture, options, NVRTC's version) makes another file; a cache
that cannot be written costs nothing but the caching. NVRTC is stood in for (this machine may have none)."""
from __future__ import annotations

import pytest

from dmacoll import cache_dir
from dmacoll.backends import cubins


@pytest.fixture
def nvrtc(monkeypatch, tmp_path):
    """A stand-in NVRTC that counts its compiles; the cache in tmp_path."""
    monkeypatch.setenv("DMACOLL_CACHE", str(tmp_path / "cache"))
    compiled = []

    def compile_(nvrtc, code, name, arch, options):
        compiled.append((code, name, arch, tuple(options)))
        return f"cubin of {code} for {arch} {options}".encode()

    monkeypatch.setattr(cubins, "_nvrtc", lambda: None)
    monkeypatch.setattr(cubins, "_version", lambda nvrtc: (13, 0))
    monkeypatch.setattr(cubins, "_compile", compile_)
    return compiled


def test_a_second_process_loads_the_cached_cubin(nvrtc, tmp_path):
    first = cubins.compile_program("kernel A", "a.cu", "sm_90")
    assert nvrtc == [("kernel A", "a.cu", "sm_90", ())]
    assert cubins.compile_program("kernel A", "a.cu", "sm_90") == first  # as a new process would find it
    assert len(nvrtc) == 1
    (cached,) = (tmp_path / "cache" / "kernels").iterdir()
    assert cached.name.startswith("a-sm_90-") and cached.read_bytes() == first


@pytest.mark.parametrize("change", ["code", "name", "arch", "options", "version"])
def test_whatever_makes_the_cubin_makes_another_file(nvrtc, monkeypatch, change):
    args = dict(code="kernel A", name="a.cu", arch="sm_90", options=())
    cubins.compile_program(**args)
    if change == "version":
        monkeypatch.setattr(cubins, "_version", lambda nvrtc: (13, 1))
    else:
        args[change] = {"code": "kernel B", "name": "b.cu", "arch": "sm_100", "options": ("-lineinfo",)}[change]
    cubins.compile_program(**args)
    assert len(nvrtc) == 2


def test_an_unwritable_or_emptied_cache_only_costs_the_caching(nvrtc, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DMACOLL_CACHE", str(blocker))  # a file where the directory would go
    assert cubins.compile_program("kernel A", "a.cu", "sm_90") == cubins.compile_program("kernel A", "a.cu", "sm_90")
    assert len(nvrtc) == 2
    monkeypatch.setenv("DMACOLL_CACHE", str(tmp_path / "cache"))
    cubin = cubins.compile_program("kernel A", "a.cu", "sm_90")
    (cached,) = (tmp_path / "cache" / "kernels").iterdir()
    cached.write_bytes(b"")  # an empty file is no cubin: compiled again
    assert cubins.compile_program("kernel A", "a.cu", "sm_90") == cubin and len(nvrtc) == 4
    assert [p.name for p in (tmp_path / "cache" / "kernels").iterdir()] == [cached.name]  # no temporary file left


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("DMACOLL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir.directory() == tmp_path / "xdg" / "dmacoll"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir.directory() == tmp_path / "home" / ".cache" / "dmacoll"
    monkeypatch.setenv("DMACOLL_CACHE", str(tmp_path / "mine"))
    assert cache_dir.directory() == tmp_path / "mine"
