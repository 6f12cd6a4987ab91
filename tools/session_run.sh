#!/usr/bin/env bash
# This session's one-GPU runs (issues 33-35): each step independent, logs under $OUT/r, packed as $OUT/r.tgz.
# Usage (device machine, repo root): [DMACOLL_GIT_SHA=<sha>] bash tools/session_run.sh STEP...
#   build      the native submission library
#   callcost   `dmacoll probe call_cost` (structure on a loopback engine, ranks sharing GPU 0)
#   check      `dmacoll check --backend cuda` with ranks sharing GPU 0 at WORLDS (default 2 3 4; above 4 two dtypes,
#              two counts), every option family
#   calibrate  `dmacoll tune --quick` at worlds 2 and 4 (ranks sharing GPU 0), then tests/gpu/test_calibration_gpu.py
#   tests      the GPU tests (GPU_TESTS: a -k expression; XDIST: pytest-xdist workers), calibration off
#   each       the same tests one pytest each (tools/gpu_tests_each.sh: results logged as they end; DEADLINE_S,
#              TEST_LIMIT_S), the way to run them with ranks sharing one GPU: xdist workers there time-slice the GPU
#              and break the tests' timing bounds
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
r=$OUT/r; mkdir -p "$r"
{ nvidia-smi; python3 -c 'import torch, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  python3 -m pip list 2>/dev/null | grep -i -E "cuda-bindings|nvidia-nccl|pytest"; } > "$r/probe.txt" 2>&1
for step in "$@"; do
  echo "== $step ($(date -u +%T))"
  case "$step" in
    build) python3 -m dmacoll_lab build --out build/native > "$r/build.log" 2>&1; tail -1 "$r/build.log" ;;
    callcost) mkdir -p "$r/call_cost"; DMACOLL_CALIBRATE=0 timeout ${CALLCOST_TIMEOUT_S:-300} python3 -m dmacoll_lab probe call_cost \
        --out "$r/call_cost/data.csv" 2>&1 | tee "$r/call_cost/run.log" | grep -E "^shared|wrote" ;;
    check) for w in ${WORLDS:-2 3 4}; do
        grid=""; [ "$w" -gt 4 ] && grid="--dtypes bfloat16 int8 --counts 1 4099"
        DMACOLL_CALIBRATE=0 DMACOLL_GPUS=1 timeout ${CHECK_TIMEOUT_S:-200} python3 -m dmacoll_lab check --backend cuda \
          --world "$w" $grid 2>&1 | tee "$r/check_cuda_one_gpu_world$w.log" | grep -E "passed|FAIL|ranks on" | tail -14
      done ;;
    calibrate) mkdir -p "$r/calibration"; for w in 2 4; do
        XDG_CACHE_HOME=$(mktemp -d) DMACOLL_GPUS=1 timeout 150 python3 -m dmacoll_lab tune --quick --world $w \
          --out "$r/calibration/table_w$w.json" > "$r/calibration_tune_w$w.log" 2>&1
        tail -3 "$r/calibration_tune_w$w.log"; done
      DMACOLL_GPUS=1 timeout 280 python3 -m pytest -v -s -m gpu tests/gpu/test_calibration_gpu.py 2>&1 \
        | tee "$r/pytest_calibration.log" | tail -25 ;;
    tests) DMACOLL_CALIBRATE=0 DMACOLL_RANK_TIMEOUT_S=${DMACOLL_RANK_TIMEOUT_S:-240} timeout ${TESTS_TIMEOUT_S:-560} \
        python3 -m pytest -v -p no:cacheprovider --timeout ${TEST_TIMEOUT_S:-300} ${XDIST:+-n $XDIST} --durations=0 \
        -m gpu tests/gpu ${GPU_TESTS:+-k "$GPU_TESTS"} 2>&1 | tee "$r/pytest_gpu${LOG_SUFFIX:-}.log" \
        | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" | tail -60 ;;
    each) nodes=$(python3 -m pytest --collect-only -q -m gpu tests/gpu ${GPU_TESTS:+-k "$GPU_TESTS"} 2>/dev/null \
        | grep "::"); DMACOLL_CALIBRATE=0 bash tools/gpu_tests_each.sh "$r/pytest_each${LOG_SUFFIX:-}.log" $nodes ;;
    *) echo "unknown step $step" ;;
  esac
done
tar czf "$OUT/r.tgz" -C "$OUT" r
