"""What `make test-vllm` installs beside vLLM on a CPU machine: vLLM's own requirements (``importlib.metadata``,
markers evaluated here) less the GPU kernel, NVIDIA library, video and codec packages, which a CPU machine cannot use
and which take most of vLLM's dependencies by size (a CI machine ran out of disk installing them). vLLM and the
packages in ``NO_DEPS`` are installed with ``--no-deps`` first; then this prints their requirements, so filtered.

    python tests/vllm_requirements.py            # the requirements, one per line
    python tests/vllm_requirements.py --no-deps  # the NO_DEPS packages as vLLM pins them
"""
from __future__ import annotations

import importlib.metadata
import re
import sys

from packaging.requirements import Requirement  # not pip's copy: importing pip turns off setuptools' distutils

# GPU kernels and their compilers, NVIDIA libraries, video and audio codecs (PyPI's are built for CUDA torch: their
# libraries fail to load beside the CPU torch when transformers imports them)
GPU_ONLY = re.compile(r"^(nvidia-.*|flashinfer.*|tilelang|quack-kernels|tokenspeed-.*|humming-kernels|nvtx|"
                      r"fastsafetensors|instanttensor|pynvvideocodec|torchvision|torchaudio|torchcodec|triton)$")
# vLLM's requirements that would pull a GPU-only one themselves: xgrammar requires triton (1 GB) for its GPU kernels
NO_DEPS = ("xgrammar",)


def _name(req: Requirement) -> str:
    return req.name.lower().replace("_", "-")


def requirements(package: str) -> list[Requirement]:
    """``package``'s requirements that apply here (markers, no extras), GPU-only ones left out."""
    out = []
    for text in importlib.metadata.requires(package) or []:
        req = Requirement(text)
        if (req.marker is None or req.marker.evaluate({"extra": ""})) and not GPU_ONLY.match(_name(req)):
            out.append(req)
    return out


def main(args: list[str]) -> str:
    top = requirements("vllm")
    if args == ["--no-deps"]:
        return "\n".join(f"{r.name}{r.specifier}" for r in top if _name(r) in NO_DEPS)  # markers applied above
    wanted = [r for r in top if _name(r) not in NO_DEPS]
    wanted += [r for package in NO_DEPS for r in requirements(package)]
    return "\n".join(dict.fromkeys(str(r) for r in wanted))


if __name__ == "__main__":
    print(main(sys.argv[1:]))
