#!/usr/bin/env bash
# Batched runs on a lent GPU machine (every visible GPU is a rank); parts run in the order given (keep each call inside the 10-minute limit).
# Usage (device machine, repo root): DMACOLL_GIT_SHA=<full sha> bash tools/gpu_reference_run.sh OUTDIR PART...
#   PART: tests    the GPU tests (tests/gpu; builds the native library first if it is missing)
#         check    `dmacoll check --backend cuda` against NCCL
#         operator the reference sweep (every variant, signal and prerecord choice) and NCCL's copy-engine path
#         breakdown control/schedule/copy/sync phases of one peer copy (CUPTI)
#         power    energy per collective (NVML), idle baseline subtracted; kernels vs copies per collective
#         interference  slowdowns of a GEMM / memory-bound kernel and a collective running together
#         smoke    a short sweep
#         build    compile + self-test the native submission library (build/native; a carried copy stays if no cc)
#         native   eager sweep, driver calls from Python vs the native library, 1 KB - 4 MB
#         batchprobe  which cuMemcpyBatchAsync calls the driver accepts (tools/probe_memcpy_batch.py)
#         c3       compute next to each collective per overlap strategy, then the strategy heuristic
#         contention  copy-engine copies (device-local vs to the peer) alone and next to a GEMM
#         probes   one-GPU probes: device-local copy paths and SM carveouts next to a GEMM, flag crossing latency
#         fewsm    one-GPU probe: copy / bf16-add kernels written for few SMs vs the driver's and torch's, next to a
#                  carved-out GEMM (tools/probe_few_sm_kernels.py)
#         ficco    finer-grain overlap scenarios (pieces d = 1, 2, 4 x world), exact checks
#         e2e      the built-in Llama/Mixtral TP (EP) inference benchmark, NCCL vs dmacoll, logits compared
# Everything (CSV + JSON provenance + logs) is packed into OUTDIR/results.tgz: few files come back.
set -u
dest=${1:?output dir}; shift; out=$dest/run; [ $# -gt 0 ] || { echo "name at least one part"; exit 2; }
mkdir -p "$out/logs"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
world=$(nvidia-smi -L | wc -l)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
log=$out/logs
{
  nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink --status | head -40
  python3 -c 'import torch, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  python3 -m pip list 2>/dev/null | grep -i -E "cuda-bindings|nvidia-nccl|nvidia-ml-py|pandas|pytest"
} > "$log/probe.txt" 2>&1
for part in "$@"; do
echo "== part $part ($(date -u +%T))"
case "$part" in
  tests)
    # GPU_TESTS (optional): a pytest -k expression; a hung test fails after DMACOLL_RANK_TIMEOUT_S with stacks
    [ -f build/native/libdmacoll_submit.so ] || python3 -m dmacoll build --out build/native > "$log/build.log" 2>&1
    DMACOLL_RANK_TIMEOUT_S=${DMACOLL_RANK_TIMEOUT_S:-150} timeout ${TESTS_TIMEOUT_S:-540} python3 -m pytest -q \
      --durations=0 -m gpu tests/gpu ${GPU_TESTS:+-k "$GPU_TESTS"} 2>&1 | tee "$out/pytest_gpu.log" | tail -25 ;;
  check)
    timeout $((100 * world)) python3 -m dmacoll check --backend cuda --world $world --reference nccl \
      --dtypes float32 bfloat16 float16 int8 int32 int64 bool --counts 1 17 4096 65537 2>&1 | tail -3 \
      | tee "$out/check_cuda.log" ;;
  operator)
    for op in all_gather all_to_all; do  # one CSV per op: a run cut short keeps the other
      timeout 300 python3 -m dmacoll sweep --ops $op --signals memop copy kernel --prerecord no yes --repeats 15 \
        --handshakes full lean \
        --submit python native --out "$out/sweep_$op.csv" > "$log/sweep_$op.log" 2>&1; tail -3 "$log/sweep_$op.log"
    done
    timeout 150 python3 -m dmacoll sweep --impls nccl_ce --out "$out/nccl_ce.csv" > "$log/nccl_ce.log" 2>&1
    tail -3 "$log/nccl_ce.log" ;;
  power)
    timeout 240 python3 -m dmacoll power --sizes 1K 64K 1M 16M 256M --seconds 1 --repeats 3 \
      --out "$out/power.csv" 2>&1 | tee "$log/power.log" | tail -30
    timeout 60 python3 -m dmacoll sm-usage --out "$out/sm_usage.csv" 2>&1 | tee "$log/sm_usage.log" | tail -14 ;;
  interference)
    timeout 120 python3 -m dmacoll interference --out "$out/interference.csv" 2>&1 | tee "$log/interference.log" \
      | tail -14 ;;
  breakdown)
    timeout 60 python3 -m dmacoll breakdown --sizes 1K 4K 16K 64K 256K 1M 4M 16M 64M 256M \
      --out "$out/breakdown.csv" 2>&1 | tee "$log/breakdown.log" | tail -14 ;;
  build)
    python3 -m dmacoll build --out build/native 2>&1 | tee "$log/build.log" | tail -2
    cp build/native/toolchain.json "$out/" 2>/dev/null ;;
  native)
    timeout 300 python3 -m dmacoll sweep --ops all_gather all_to_all --impls nccl dma --variants pcpy b2b \
      --directions push --places out --signals memop copy --submit python native --modes eager --max-bytes 4M \
      --repeats 15 --out "$out/native.csv" > "$log/native.log" 2>&1; tail -3 "$log/native.log" ;;
  batchprobe)
    timeout 240 python3 tools/probe_memcpy_batch.py "$out/memcpy_batch.csv" 2>&1 | tee "$log/memcpy_batch.log" \
      | tail -40 ;;
  c3)
    timeout ${C3_TIMEOUT_S:-540} python3 -m dmacoll c3 --out "$out/c3.csv" > "$log/c3.log" 2>&1; tail -12 "$log/c3.log"
    python3 -m dmacoll.analysis.c3_rules "$out/c3.csv" > "$log/c3_heuristics.log" 2>&1; tail -30 "$log/c3_heuristics.log" ;;
  contention)
    timeout 120 python3 tools/probe_copy_contention.py "$out/copy_contention.csv" 2>&1 | tee "$log/copy_contention.log" \
      | tail -10 ;;
  probes)
    for t in local_copy_paths flag_latency sm_carveout; do
      timeout 120 python3 tools/probe_$t.py "$out/$t.csv" 2>&1 | tee "$log/$t.log" | tail -4
    done ;;
  fewsm)
    timeout 240 python3 tools/probe_few_sm_kernels.py "$out/few_sm_kernels.csv" 2>&1 | tee "$log/few_sm_kernels.log" \
      | tail -40 ;;
  ficco)
    timeout ${FICCO_TIMEOUT_S:-240} python3 -m dmacoll ficco --out "$out/ficco.csv" > "$log/ficco.log" 2>&1
    tail -12 "$log/ficco.log" ;;
  e2e)
    timeout ${E2E_TIMEOUT_S:-300} python3 -m dmacoll e2e --out "$out/e2e.csv" > "$log/e2e.log" 2>&1
    tail -25 "$log/e2e.log" ;;
  smoke)
    timeout 200 python3 -m dmacoll sweep --max-bytes 4M --repeats 3 --out "$out/sweep.csv" 2>&1 | tail -30 ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
done
tar czf "$dest/results.tgz" -C "$out" . && rm -r "$out"
