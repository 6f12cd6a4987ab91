#!/usr/bin/env bash
# One device call of this session's one-GPU work: each step independent, logs under $OUT/r, packed as $OUT/r.tgz.
# Usage (device machine, repo root): bash tools/session_run.sh STEP...
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
r=$OUT/r; mkdir -p "$r"
{ nvidia-smi; python3 -c 'import torch, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  python3 -m pip list 2>/dev/null | grep -i -E "cuda-bindings|nvidia-nccl|pytest"; } > "$r/probe.txt" 2>&1
for step in "$@"; do
  echo "== $step ($(date -u +%T))"
  case "$step" in
    build) python3 -m dmacoll_lab build --out build/native > "$r/build.log" 2>&1; tail -2 "$r/build.log" ;;
    smoke) for w in 2 4; do
        DMACOLL_GPUS=1 timeout 150 python3 -m dmacoll_lab check --backend cuda --world $w --dtypes bfloat16 int8 \
          --counts 1 4099 2>&1 | tee "$r/smoke_w$w.log" | tail -14; done ;;
    family) # FAMILY WORLD [DEADLINE]: one check family, timed, stacks dumped if it hangs
        DMACOLL_GPUS=1 timeout ${FAMILY_TIMEOUT_S:-150} python3 -X faulthandler -m dmacoll_lab check --backend cuda \
          --world ${WORLD:-4} --dtypes ${DTYPES:-bfloat16} --counts ${COUNTS:-4099} --families $FAMILY \
          --deadline-s ${DEADLINE_S:-120} 2>&1 | tee "$r/family_${FAMILY// /_}_w${WORLD:-4}.log" | tail -30 ;;
    callcost) timeout ${CALLCOST_TIMEOUT_S:-300} python3 -m dmacoll_lab probe call_cost --out "$r/call_cost/data.csv" \
        2>&1 | tee "$r/call_cost.log" | tail -70 ;;
    tests) DMACOLL_RANK_TIMEOUT_S=${DMACOLL_RANK_TIMEOUT_S:-200} timeout ${TESTS_TIMEOUT_S:-400} python3 -m pytest -v --timeout ${TEST_TIMEOUT_S:-240} \
        --durations=15 -m gpu tests/gpu ${GPU_TESTS:+-k "$GPU_TESTS"} 2>&1 | tee "$r/pytest_gpu.log" | tail -40 ;;
    *) echo "unknown step $step" ;;
  esac
done
tar czf "$OUT/r.tgz" -C "$OUT" r
