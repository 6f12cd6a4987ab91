#!/usr/bin/env bash
# Batched runs on a lent GPU machine (every visible GPU is a rank); parts run in the order given (keep each call inside the 10-minute limit).
# Usage (device machine, repo root): DMACOLL_GIT_SHA=<full sha> bash tools/gpu_reference_run.sh OUTDIR PART...
#   PART: tests    the GPU tests (tests/gpu), one pytest per test, then dmacoll check and tune (tools/gpu_suite.sh
#                  PIN=0: every GPU visible; TESTS_TIMEOUT_S: its deadline)
#         check    `dmacoll check --backend cuda` against NCCL
#         shared   several ranks on GPU 0 (DMACOLL_GPUS=1, the IPC heap): `dmacoll check --backend cuda` at worlds
#                  SHARED_WORLDS (default 2..8; above 4 two dtypes and two counts), every option family, against the
#                  CPU reference (correctness only: a shared GPU gives no performance figures)
#         operator the reference sweep (every variant, signal and prerecord choice) and NCCL's copy-engine path
#         breakdown control/schedule/copy/sync phases of one peer copy (CUPTI)
#         power    energy per collective (NVML), idle baseline subtracted; kernels vs copies per collective
#         interference  slowdowns of a GEMM / memory-bound kernel and a collective running together
#         smoke    a short sweep
#         defaults what Communicator() gives (dma_default rows, eager and graph) beside the configurations 'auto' may
#                  choose (the oracle's dma rows, full and lean handshake), NCCL and one peer copy, all_gather and
#                  all_to_all, 1 KB - 256 MB, one sweep per op, from an empty calibration cache (no shipped table
#                  fits: the first Communicator() calibrates, its notice and time in run.log); then dma_default alone
#                  (with NCCL beside it) under each other source of its choices: a table calibrated from scratch
#                  (`dmacoll tune --quick`, shipped tables hidden; wall time in tune.log), the shipped 2x H200 table,
#                  no table (DMACOLL_CALIBRATE=0: the fallback where no shipped table fits); the other ops
#         build    compile + self-test the native submission library (build/native; a carried copy stays if no cc);
#                  its build.log and toolchain.json go beside the native run (native/native/)
#         native   eager sweep, driver calls from Python vs the native library, 1 KB - 4 MB
#         batchprobe  which cuMemcpyBatchAsync calls the driver accepts (`dmacoll probe memcpy_batch`, 2 GPUs)
#         c3       compute next to each collective per overlap strategy, then the strategy heuristic
#         contention  copy-engine copies (device-local vs to the peer) alone and next to a GEMM
#                  (`dmacoll probe copy_contention`, 2 GPUs)
#         probes   one-GPU probes: device-local copy paths and SM carveouts next to a GEMM, flag crossing latency
#                  (`dmacoll probe local_copy_paths | flag_latency | sm_carveout`; sm_carveout's GEMM-cost table
#                  goes in a run folder of its own, probes/sm_carveout_gemm_cost/)
#         callcost one-GPU probe: a small all-gather's per-call time and structure by variant and handshake, one
#                  process on a loopback engine (no crossing) and world ranks on GPU 0, beside their floors
#                  (`dmacoll probe call_cost`)
#         timeline a small all-gather per configuration beside its floors (one copy, one flag crossing with every
#                  peer) and NCCL, a GPU per rank, with every rank's CUPTI records of one replay, at worlds 2 and 4
#                  (`dmacoll probe call_timeline`; TIMELINE_ARGS: more options, e.g. --max-connections 1 32)
#         smpath   the sm path's one-shot kernels (dmacoll.backends.cuda_sm) against NCCL and torch symmetric
#                  memory's one-shot all-reduce, a GPU per rank, worlds 2 and 4, checked exactly after timing
#                  (`dmacoll probe sm_path`; SMPATH_ARGS: more options)
#         window   a rank's peer copies and flags as rows of one 2D copy over a window mapping every peer's heap,
#                  a GPU per rank, worlds 2 and 4, checked against NCCL (`dmacoll probe peer_window`; WINDOW_ARGS)
#         submit   one-GPU probe: host cost per call of k copies from Python, one batch call, the native library
#                  (`dmacoll probe submit_cost`)
#         crossing a completion crossing by halves: each send (memop, copy, kernel) x each wait (memop, spin,
#                  fold, host), eager and graph, two streams and two processes (CUDA IPC) on GPU 0, and with two
#                  GPUs visible also GPU 0 -> GPU 1 (`dmacoll probe crossing`)
#         fewsm    one-GPU probe: copy / bf16-add kernels written for few SMs vs the driver's and torch's, next to a
#                  carved-out GEMM (`dmacoll probe few_sm_kernels`)
#         ficco    finer-grain overlap scenarios (pieces d = 1, 2, 4 x world), exact checks
#         calibrate  calibration where no table fits (issue 34): `dmacoll tune --quick` at worlds 2 and 4, then
#                  tests/gpu/test_calibration_gpu.py (notice, progress, one table on every rank, cache, reuse);
#                  worlds above the GPU count put several ranks on one GPU (the IPC heap: mechanics, not performance)
#         checkcost  what the cross-rank check of each call (Communicator check_calls, DMACOLL_CHECK_CALLS=1) adds
#                  to an eager call, every op at 1 KB and 1 MB (`dmacoll check-cost`)
#         e2e      the built-in Llama/Mixtral TP (EP) inference benchmark, NCCL vs dmacoll under each schedule (serial,
#                  microbatch, seqpar), logits compared; E2E_ARGS: more `dmacoll e2e` options; on one GPU NCCL alone
#                  (the schedules run their compute, micro-batch streams and graphs; no dmacoll below 2 ranks)
# Everything is packed into OUTDIR/results.tgz (few files come back), laid out as results/<machine>/ is: a run folder
# <experiment>/<run>/ per output (data.csv, data.json provenance, run.log), this call's machine probe (nvidia-smi,
# versions) as <experiment>/probe.txt, test logs under tests/. Unpack it into the machine's folder:
#   tar xzf results.tgz -C results/<machine>/   (then say in each experiment's README.md what was run)
set -u
dest=${1:?output dir}; shift; out=$dest/run; [ $# -gt 0 ] || { echo "name at least one part"; exit 2; }
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
world=$(nvidia-smi -L | wc -l)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
probe=$dest/probe.txt
bash tools/machine_probe.sh > "$probe" 2>&1
# rundir EXPERIMENT[/RUN]: make the folder, put this call's probe into the experiment, print the folder
rundir() { mkdir -p "$out/$1"; cp "$probe" "$out/${1%%/*}/probe.txt"; echo "$out/$1"; }
for part in "$@"; do
echo "== part $part ($(date -u +%T))"
case "$part" in
  tests)
    # one pytest per test on every visible GPU (tools/gpu_suite.sh PIN=0, with the checks and calibration after):
    # each result is logged as it ends, and a hung test prints its ranks' stacks before its limit
    d=$(rundir tests)
    OUT=$d PIN=0 DEADLINE_S=${TESTS_TIMEOUT_S:-540} bash tools/gpu_suite.sh
    grep -E "^(PASS|FAIL|TIMEOUT|SKIP|lanes)" "$d/all_gpus/lanes.log" | tail -70 ;;
  check)
    d=$(rundir tests)
    timeout $((100 * world)) python3 -m dmacoll_lab check --backend cuda --world $world --reference nccl \
      --dtypes float32 bfloat16 float16 int8 int32 int64 bool --counts 1 17 4096 65537 2>&1 | tail -3 \
      | tee "$d/check_cuda_world$world.log" ;;
  shared)
    d=$(rundir tests)
    for w in ${SHARED_WORLDS:-2 3 4 5 6 7 8}; do
      grid=""; [ "$w" -gt 4 ] && grid="--dtypes bfloat16 int8 --counts 1 4099"
      DMACOLL_GPUS=1 timeout ${SHARED_TIMEOUT_S:-300} python3 -m dmacoll_lab check --backend cuda --world "$w" $grid \
        2>&1 | tee "$d/check_cuda_shared_world$w.log" | tail -12
    done ;;
  operator)
    for op in all_gather all_to_all; do  # one CSV per op: a run cut short keeps the other
      d=$(rundir operator/sweep_$op)
      timeout 300 python3 -m dmacoll_lab sweep --ops $op --signals memop copy kernel --prerecord no yes --repeats 15 \
        --handshakes full lean \
        --submit python native --out "$d/data.csv" > "$d/run.log" 2>&1; tail -3 "$d/run.log"
    done
    d=$(rundir operator/nccl_ce)
    timeout 150 python3 -m dmacoll_lab sweep --impls nccl_ce --out "$d/data.csv" > "$d/run.log" 2>&1
    tail -3 "$d/run.log" ;;
  power)
    d=$(rundir power/power)
    timeout 240 python3 -m dmacoll_lab power --sizes 1K 64K 1M 16M 256M --seconds 1 --repeats 3 \
      --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -30
    d=$(rundir power/sm_usage)
    timeout 60 python3 -m dmacoll_lab sm-usage --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -14 ;;
  interference)
    d=$(rundir power/interference)
    timeout 120 python3 -m dmacoll_lab interference --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -14 ;;
  breakdown)
    d=$(rundir breakdown/breakdown)
    timeout 60 python3 -m dmacoll_lab breakdown --sizes 1K 4K 16K 64K 256K 1M 4M 16M 64M 256M \
      --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -14 ;;
  build)
    d=$(rundir native/native)
    python3 -m dmacoll_lab build --out build/native 2>&1 | tee "$d/build.log" | tail -2
    cp build/native/toolchain.json "$d/" 2>/dev/null ;;
  native)
    d=$(rundir native/native)
    timeout 300 python3 -m dmacoll_lab sweep --ops all_gather all_to_all --impls nccl dma --variants pcpy b2b \
      --directions push --places out --signals memop copy --submit python native --modes eager --max-bytes 4M \
      --repeats 15 --out "$d/data.csv" > "$d/run.log" 2>&1; tail -3 "$d/run.log" ;;
  batchprobe)
    d=$(rundir operator/memcpy_batch)
    timeout 240 python3 -m dmacoll_lab probe memcpy_batch --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -40 ;;
  c3)
    d=$(rundir c3/c3)
    timeout ${C3_TIMEOUT_S:-540} python3 -m dmacoll_lab c3 --out "$d/data.csv" > "$d/run.log" 2>&1; tail -12 "$d/run.log"
    python3 -m dmacoll_lab rules c3 "$d/data.csv" > "$d/c3_rules.log" 2>&1; tail -30 "$d/c3_rules.log" ;;
  contention)
    d=$(rundir c3/copy_contention)
    timeout 120 python3 -m dmacoll_lab probe copy_contention --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -10 ;;
  probes)
    for t in local_copy_paths flag_latency sm_carveout; do
      d=$(rundir probes/$t)
      # sm_carveout also writes its GEMM-cost table, into probes/sm_carveout_gemm_cost/
      timeout 120 python3 -m dmacoll_lab probe $t --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -4
    done ;;
  callcost)
    d=$(rundir probes/call_cost)  # one process (structure) and world ranks on GPU 0 (shared)
    timeout ${CALLCOST_TIMEOUT_S:-400} python3 -m dmacoll_lab probe call_cost --out "$d/data.csv" 2>&1 \
      | tee "$d/run.log" | tail -60 ;;
  timeline)
    d=$(rundir probes/call_timeline)  # its activities table goes in probes/call_timeline_activities/
    timeout ${TIMELINE_TIMEOUT_S:-540} python3 -m dmacoll_lab probe call_timeline ${TIMELINE_ARGS:-} \
      --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -120 ;;
  smpath)
    d=$(rundir probes/sm_path)
    timeout ${SMPATH_TIMEOUT_S:-540} python3 -m dmacoll_lab probe sm_path ${SMPATH_ARGS:-} --out "$d/data.csv" 2>&1 \
      | tee "$d/run.log" | tail -100 ;;
  window)
    d=$(rundir small_calls/peer_window)
    timeout ${WINDOW_TIMEOUT_S:-400} python3 -m dmacoll_lab probe peer_window ${WINDOW_ARGS:-} --out "$d/data.csv" \
      2>&1 | tee "$d/run.log" | tail -100 ;;
  submit)
    d=$(rundir probes/submit_cost)
    timeout 180 python3 -m dmacoll_lab probe submit_cost --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -32 ;;
  crossing)
    d=$(rundir probes/crossing)  # every placement the visible GPUs allow (peer with two)
    timeout ${CROSSING_TIMEOUT_S:-420} python3 -m dmacoll_lab probe crossing ${CROSSING_ARGS:-} --out "$d/data.csv" 2>&1 | tee "$d/run.log" \
      | tail -75 ;;
  fewsm)
    d=$(rundir probes/few_sm_kernels)
    timeout 240 python3 -m dmacoll_lab probe few_sm_kernels --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -40 ;;
  ficco)
    d=$(rundir ficco/ficco)
    timeout ${FICCO_TIMEOUT_S:-240} python3 -m dmacoll_lab ficco --out "$d/data.csv" > "$d/run.log" 2>&1
    tail -12 "$d/run.log" ;;
  e2e)
    d=$(rundir e2e/e2e)
    one=""; [ "$world" -lt 2 ] && one="--impls nccl"
    timeout ${E2E_TIMEOUT_S:-300} python3 -m dmacoll_lab e2e $one ${E2E_ARGS:-} --out "$d/data.csv" > "$d/run.log" 2>&1
    tail -25 "$d/run.log" ;;
  calibrate)
    d=$(rundir calibration/quick)
    for w in 2 4; do
      XDG_CACHE_HOME=$(mktemp -d) timeout 150 python3 -m dmacoll_lab tune --quick --world $w \
        --out "$d/table_w$w.json" > "$d/tune_w$w.log" 2>&1; tail -3 "$d/tune_w$w.log"
    done
    timeout 280 python3 -m pytest -q -s -m gpu tests/gpu/test_calibration_gpu.py 2>&1 \
      | tee "$d/pytest_calibration.log" | tail -25 ;;
  checkcost)
    d=$(rundir check_calls/check_cost)
    timeout 240 python3 -m dmacoll_lab check-cost --out "$d/data.csv" 2>&1 | tee "$d/run.log" | tail -3 ;;
  defaults)
    XDG_CACHE_HOME=$(mktemp -d); export XDG_CACHE_HOME
    for op in all_gather all_to_all; do
      d=$(rundir defaults/sweep_$op)
      timeout ${DEFAULTS_TIMEOUT_S:-200} python3 -m dmacoll_lab sweep --ops $op --impls nccl dma_default dma peer_copy \
        --signals memop copy --prerecord no yes --submit python native --handshakes full lean --repeats 15 \
        --out "$d/data.csv" > "$d/run.log" 2>&1; grep -E "calibrat" "$d/run.log" | head -3; tail -1 "$d/run.log"
    done
    d=$(rundir defaults/calibrated)
    { time timeout 120 python3 -m dmacoll_lab tune --quick --out "$d/table.json"; } > "$d/tune.log" 2>&1
    tail -4 "$d/tune.log"
    for source in calibrated shipped_h200x2 none; do
      d=$(rundir defaults/default_$source)
      case $source in calibrated) env="DMACOLL_TUNING=$out/defaults/calibrated/table.json";;
        shipped_h200x2) env="DMACOLL_TUNING=$PWD/src/dmacoll/tuning_tables/h200x2.json";;
        none) env="DMACOLL_CALIBRATE=0 XDG_CACHE_HOME=$(mktemp -d)";; esac
      env $env timeout 120 python3 -m dmacoll_lab sweep --ops all_gather all_to_all --impls nccl dma_default \
        --repeats 15 --out "$d/data.csv" > "$d/run.log" 2>&1; tail -1 "$d/run.log"
    done
    d=$(rundir defaults/other_ops)
    timeout 150 python3 -m dmacoll_lab sweep --ops all_to_all_v reduce_scatter all_reduce --impls nccl dma_default \
      peer_copy --repeats 15 --out "$d/data.csv" > "$d/run.log" 2>&1; tail -1 "$d/run.log" ;;
  smoke)
    d=$(rundir operator/smoke)
    timeout 200 python3 -m dmacoll_lab sweep --max-bytes 4M --repeats 3 --out "$d/data.csv" 2>&1 | tee "$d/run.log" \
      | tail -30 ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
done
tar czf "$dest/results.tgz" -C "$out" . && rm -r "$out"
