#!/usr/bin/env bash
# What a device run ran on, for its provenance: GPUs, topology, NVLink, driver, python, torch, CUDA, NCCL, the
# packages that matter, and the commit (DMACOLL_GIT_SHA: the device copy of the tree has no .git).
# Usage (device machine, repo root): bash tools/machine_probe.sh > probe.txt 2>&1
nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink --status | head -40
python3 -c 'import torch, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None, "gpus", torch.cuda.device_count())'
python3 -m pip list 2>/dev/null | grep -i -E "cuda-bindings|nvidia-nccl|nvidia-ml-py|pandas|pytest"
echo "DMACOLL_GIT_SHA=${DMACOLL_GIT_SHA:-}"
