#!/usr/bin/env bash
# GPU tests one pytest process per test, so each result (and a failure's tail) is written the moment it ends and a
# call cut by its time limit still keeps every finished result. Usage (device machine, repo root):
#   [DEADLINE_S=540] [TEST_LIMIT_S=200] bash tools/gpu_tests_each.sh LOG NODE...
# A test is skipped, not started, when less than TEST_LIMIT_S is left before DEADLINE_S.
set -u
log=$1; shift
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$SECONDS limit=${TEST_LIMIT_S:-200} deadline=${DEADLINE_S:-540}
for node in "$@"; do
  if (( SECONDS - start + limit > deadline )); then echo "NOT RUN (no time left) $node" | tee -a "$log"; continue; fi
  t0=$SECONDS
  out=$(timeout "$limit" python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu "$node" 2>&1); rc=$?
  case $rc in 0) verdict=PASS;; 5) verdict=NONE;; 124) verdict=TIMEOUT;; *) verdict=FAIL;; esac
  grep -q "1 skipped" <<<"$out" && verdict=SKIP
  echo "$verdict $((SECONDS - t0))s $node" | tee -a "$log"
  [ "$verdict" = PASS ] || { echo "$out" | tail -30 | cut -c1-400 | sed 's/^/    /' >> "$log"; }
done
