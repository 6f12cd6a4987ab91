#!/usr/bin/env bash
# The whole GPU test suite (worlds 2 and 4), `dmacoll check --backend cuda` at worlds 4 and 2 with every family
# (then 8, 3, 5, 6, 7 as time allows, with the sm path's family alone) and `dmacoll tune --quick` at worlds 2 and 4,
# one process per item (a hang costs one item, and each result is logged as it ends).
#   PIN=1 (default): every multi-rank CUDA path on ONE GPU (issue 33): each item sees one GPU, its ranks sharing it
#     through the IPC heap (correctness only: no timing from a shared GPU is a performance result);
#     tools/gpu_lanes.sh spreads the items over the visible GPUs, a lane per GPU.
#   PIN=0: one lane seeing every GPU: the ranks of an item get a GPU each where there are enough.
# Usage (device machine, repo root): [DMACOLL_GIT_SHA=<sha>] [DEADLINE_S=540] [PIN=0] bash tools/gpu_suite.sh
#   Results: $OUT/one_gpu/ (PIN=0: $OUT/all_gpus/): lanes.log, a line per item; logs/, each item's output. The same
#   command again on the same warm machine goes on with the items not run yet (the queue and what ran are kept in
#   build/gpu_suite_<one_gpu|all_gpus>/).
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 DMACOLL_CALIBRATE=0
where=$([ "${PIN:-1}" = 1 ] && echo one_gpu || echo all_gpus)
state=$PWD/build/gpu_suite_$where res=$OUT/$where
mkdir -p "$state" "$res"
bash tools/machine_probe.sh > "$res/probe.txt" 2>&1
[ -f build/native/libdmacoll_submit.so ] || python3 -m dmacoll_lab build --out build/native > "$res/build.log" 2>&1
# limit: an item's time limit (s), also what the lanes fit before the deadline: 3-5x what it took on 4x H100 with
# an item per GPU (2026-11-27, results/h100x4/tests: every op 31-41 s, check at world 4 37 s, calibration at world 4
# 107 s, lean pipelines 67 s, most others 11-25 s); the largest must fit inside one call's DEADLINE_S
limit() {
  case $1 in *calibration*\[4\]|*uneven*) echo 400;; *every_op_variant*|*lean*|*e2e*|*calibration*|check_w*) echo 200;;
    tune_quick_w*) echo 300;; *) echo 120;; esac
}
if [ ! -s "$state/queue" ]; then
  nodes=$(python3 -m pytest --collect-only -q -m gpu tests/gpu 2>/dev/null | grep "::")
  pytest_item() {  # -s: the ranks' output (calibration's notice and progress, a hung rank's stacks) goes to the log
    echo "$(limit "$1") $(sed 's#tests/gpu/##; s#[^A-Za-z0-9_.-]#_#g' <<<"$1") python3 -m pytest -q -s" \
      "-p no:cacheprovider --tb=short -m gpu '$1'"; }
  check_item() {  # world, grid
    local n=$(limit check_w$1)
    echo "$n check_w$1 python3 -m dmacoll_lab check --backend cuda --world $1 $2 --deadline-s $((n - 20))"; }
  tune_item() { echo "$(limit tune_quick_w$1) tune_quick_w$1 env -u DMACOLL_CALIBRATE XDG_CACHE_HOME=\$(mktemp -d)" \
    "python3 -m dmacoll_lab tune --quick --world $1 --out $state/logs/table_w$1.json"; }
  {
    echo "# LIMIT_S NAME COMMAND (lanes take the first that fits)"
    for n in $nodes; do [[ $n == *every_op_variant* ]] && pytest_item "$n"; done
    check_item 4 "--dtypes bfloat16 int8 --counts 1 4099"
    for n in $nodes; do [[ $n == *every_op_variant* ]] || pytest_item "$n"; done | sort -rn -s -k1,1
    tune_item 2; tune_item 4
    check_item 2 "--dtypes float32 bfloat16 int8 --counts 1 17 4099 65537"
    for w in 8 3 5 6 7; do check_item $w "--dtypes bfloat16 int8 --counts 1 4099 --families path=sm"; done
  } > "$state/queue"
fi
cp "$state/queue" "$res/queue.txt"
PIN=${PIN:-1} DEADLINE_S=${DEADLINE_S:-540} bash tools/gpu_lanes.sh "$state" "$state/queue" "$state/lanes.log"
cp "$state/lanes.log" "$state/done" "$res/"; cp -r "$state/logs" "$res/"
