"""tests/vllm_requirements.py: what `make test-vllm` installs beside vLLM on a CPU machine."""
from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_requirements  # noqa: E402

FAKE = {"vllm": ["regex", "torch==2.13.0", "torchvision==0.28.0", "nvidia-cutlass-dsl[cu13]==4.8.0", "triton",
                 "flashinfer-python==0.7.0.post1", "xgrammar==0.2.8; python_version > '3.0'",
                 "zentorch==2.13.0.1; extra == 'zen'", "six>=1.16.0; python_version > '3.0'", "tokenspeed-mla==0.2.15",
                 "transformers<5.20.0,>=5.16.1"],
        "xgrammar": ["apache-tvm-ffi", "triton; platform_system == 'Linux'", "transformers>=4.38.0", "numpy"]}


def test_gpu_only_requirements_and_extras_are_left_out_and_no_deps_packages_bring_their_own(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "requires", lambda package: FAKE[package])
    wanted = vllm_requirements.main([]).splitlines()
    assert wanted[:4] == ["regex", "torch==2.13.0", "six>=1.16.0; python_version > \"3.0\"",
                          "transformers<5.20.0,>=5.16.1"]
    assert wanted[4:] == ["apache-tvm-ffi", "transformers>=4.38.0", "numpy"]  # xgrammar's, less triton
    assert not any(name in " ".join(wanted) for name in ("torchvision", "nvidia", "triton", "flashinfer", "zentorch",
                                                         "tokenspeed", "xgrammar"))
    no_deps = vllm_requirements.main(["--no-deps"]).splitlines()
    assert no_deps == ["xgrammar==0.2.8"]  # without its marker: the shell takes it as one word
