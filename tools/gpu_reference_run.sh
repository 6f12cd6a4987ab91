#!/usr/bin/env bash
# Batched runs on the lent 2-GPU machine, one part per call (each fits the 10-minute command limit).
# Usage (device machine, repo root): DMACOLL_GIT_SHA=<full sha> bash tools/gpu_reference_run.sh OUTDIR PART
#   PART: tests    probe, GPU tests, `dmacoll check --backend cuda` against NCCL
#         operator the reference sweep (every variant, signal and prerecord choice) and NCCL's copy-engine path
#         power    energy per collective (NVML), idle baseline subtracted; kernels vs copies per collective
#         interference  slowdowns of a GEMM / memory-bound kernel and a collective running together
#         smoke    a short sweep
# Logs go into OUTDIR/logs.tgz so that few files come back.
set -u
out=${1:?output dir}; part=${2:?part}
mkdir -p "$out/logs"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
log=$out/logs
{
  nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink --status | head -40
  python3 -c 'import torch, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  python3 -m pip list 2>/dev/null | grep -i -E "cuda-bindings|nvidia-nccl|nvidia-ml-py|pandas|pytest"
} > "$log/probe.txt" 2>&1
case "$part" in
  tests)
    echo "== gpu tests"; timeout 330 python3 -m pytest -q -m gpu tests/gpu 2>&1 | tee "$out/pytest_gpu.log" | tail -15
    echo "== cuda check against NCCL"; timeout 200 python3 -m dmacoll check --backend cuda --world 2 --reference nccl \
      --dtypes float32 bfloat16 float16 int8 int32 int64 bool --counts 1 17 4096 65537 2>&1 | tail -3 \
      | tee -a "$out/pytest_gpu.log" ;;
  operator)
    timeout 400 python3 -m dmacoll sweep --signals memop copy --prerecord no yes --out "$out/sweep.csv" \
      > "$log/sweep.log" 2>&1; tail -5 "$log/sweep.log"
    timeout 150 python3 -m dmacoll sweep --impls nccl_ce --out "$out/nccl_ce.csv" > "$log/nccl_ce.log" 2>&1
    tail -3 "$log/nccl_ce.log" ;;
  power)
    timeout 420 python3 -m dmacoll power --sizes 1K 64K 1M 16M 256M --seconds 2 --repeats 3 \
      --out "$out/power.csv" 2>&1 | tee "$log/power.log" | tail -30
    timeout 150 python3 -m dmacoll sm-usage --out "$out/sm_usage.csv" 2>&1 | tee "$log/sm_usage.log" | tail -14 ;;
  interference)
    timeout 540 python3 -m dmacoll interference --out "$out/interference.csv" 2>&1 | tee "$log/interference.log" \
      | tail -14 ;;
  smoke)
    timeout 200 python3 -m dmacoll sweep --max-bytes 4M --repeats 3 --out "$out/sweep.csv" 2>&1 | tail -30 ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
tar czf "$out/logs.tgz" -C "$out" logs && rm -r "$log"
