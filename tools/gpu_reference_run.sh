#!/usr/bin/env bash
# One batched run on the lent 2-GPU machine: probe, GPU tests, reference sweeps.
# Usage (device machine, repo root): DMACOLL_GIT_SHA=<sha> bash tools/gpu_reference_run.sh OUTDIR [smoke|full]
set -u
out=${1:?output dir}; what=${2:-full}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink --status | head -40
  python3 -c 'import torch, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  python3 -m pip list 2>/dev/null | grep -i -E "cuda-bindings|nvidia-nccl|pandas|pytest"
} > "$out/probe.txt" 2>&1
echo "== gpu tests"; timeout 300 python3 -m pytest -q -m gpu tests/gpu -x 2>&1 | tee "$out/pytest_gpu.log" | tail -15
echo "== cuda check against NCCL"; timeout 200 python3 -m dmacoll check --backend cuda --world 2 --reference nccl \
  --dtypes float32 bfloat16 float16 int8 int32 int64 bool --counts 1 17 4096 65537 2>&1 | tail -3 | tee -a "$out/pytest_gpu.log"
if [ "$what" = smoke ]; then
  timeout 200 python3 -m dmacoll sweep --max-bytes 4M --min-bytes 1K --repeats 3 --out "$out/sweep.csv" 2>&1 | tail -60
else
  timeout 420 python3 -m dmacoll sweep --signals memop copy --prerecord no yes --out "$out/sweep.csv" 2>&1 | tee "$out/sweep.log" | tail -40
fi
timeout 150 python3 -m dmacoll sweep --impls nccl_ce --out "$out/nccl_ce.csv" > "$out/nccl_ce.log" 2>&1
tail -5 "$out/nccl_ce.log"
