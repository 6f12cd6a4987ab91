#!/usr/bin/env bash
# Side-by-side experiment: flag writes that hand over no data with and without a memory fence
# (DMACOLL_LIGHT_SIGNALS), interleaved twice on one machine, then a correctness check of the light mode.
# Usage (device machine, repo root): DMACOLL_GIT_SHA=<sha> bash tools/gpu_light_signals.sh OUTDIR
set -u
out=${1:?output dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for round in a b; do
  for light in 0 1; do
    DMACOLL_LIGHT_SIGNALS=$light timeout 120 python3 -m dmacoll sweep --impls nccl dma peer_copy --variants pcpy \
      --directions push --modes graph --out "$out/light${light}${round}.csv" 2>&1 | tail -2
  done
done
DMACOLL_LIGHT_SIGNALS=1 timeout 150 python3 -m dmacoll check --backend cuda --world 2 --reference nccl \
  --dtypes bfloat16 int8 int64 --counts 1 4099 300001 2>&1 | tail -2
