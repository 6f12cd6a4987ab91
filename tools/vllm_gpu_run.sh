#!/usr/bin/env bash
# vLLM with the dmacoll plugin on a lent GPU machine (no network), after the bundle's pieces arrived.
# Usage (device machine, repo root): DMACOLL_GIT_SHA=<full sha> [TP=n] bash tools/vllm_gpu_run.sh OUTDIR [STEP...]
#   (TP: the check's)
#   STEP: install  check, join and install the bundle (build/vllm_bundle/, from `tools/vllm_bundle.py`) into
#                  build/vllm_site, and dmacoll as a distribution beside it (a wheel built here: vLLM finds the
#                  plugin through its `vllm.general_plugins` entry point); skipped when already done
#         tests    the plugin's tests against that vLLM (the CPU ones and tests/gpu/test_vllm_gpu.py)
#         bench    the workflow's vLLM runs (rules vllm_model, vllm_bench, vllm_results; config/vllm_lent.yaml over
#                  the machine's config: Llama-3.1-8B shapes, dummy weights, `vllm bench latency` and `throughput`
#                  at each TP the machine holds from 2 up, the plugin off and on in rounds of alternating order)
#                  through lent_snakemake.sh (carry build/snakemake_bundle too); what a call leaves undone, `bench`
#                  in the next call on the warm machine goes on with (DEADLINE_S, default 540, per call);
#                  VLLM_CONFIGS: other config files instead of config/vllm_lent.yaml (each over the one before)
#         check    `dmacoll vllm check` at TP (2 or more): outputs with the plugin off and on (five vLLM starts,
#                  about 100 s each at TP 4: REUSE=1 in a second call goes on from the settings a first one finished;
#                  DEADLINE_S, default 500, stops it in time for the results to be packed inside the call's limit)
#   default: install tests bench. Each step's time is printed; split the steps over calls to stay inside 10 minutes
#   (build/ stays on a warm machine between calls). Each vLLM start costs about 1-2 minutes.
# Out: OUTDIR/results.tgz laid out as results/<machine>/ is (vllm/bench/: data.csv, data.json, raw/; unpack with
# `tar xzf results.tgz -C results/<machine>/`), OUTDIR/summary.txt, OUTDIR/lent-gpu.json (this machine's snapshot:
# compare with envs/lent-gpu.json).
set -u
dest=${1:?output dir}; shift
steps=${*:-install tests bench}
out=$dest/run; mkdir -p "$out"
bundle=build/vllm_bundle; site=$PWD/build/vllm_site; py=${PYTHON:-python3}; tp=${TP:-1}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLREDUCE_USE_SYMM_MEM=0
summary=$dest/summary.txt
say() { echo "$*" | tee -a "$summary"; }
# the machine's own packages, before the bundle is on the path
"$py" tools/vllm_bundle.py "$dest/lent-gpu.json" --probe > /dev/null 2>&1 \
  || say "probe failed (python3 tools/vllm_bundle.py X --probe)"
# dmacoll's code from this checkout; vLLM, its wheels and dmacoll's entry point from the site
export PYTHONPATH=$PWD/src:$site
{
  nvidia-smi; "$py" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, torch.version.cuda)'
  cat "$site/.dmacoll_bundle" 2>/dev/null; "$py" -m pip --version
} > "$out/probe.txt" 2>&1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
gpus=$(nvidia-smi -L | wc -l)
case "$gpu" in *H200*) machine=h200x$gpus ;; *H100*) machine=h100x$gpus ;; *) machine=gpux$gpus ;; esac
say "machine $machine ($gpu), TP $tp, steps: $steps"
for step in $steps; do
t0=$(date +%s)
case "$step" in
  install)
    if [ -f "$site/.dmacoll_bundle" ] && [ "$(cat "$site/.dmacoll_bundle")" = "$(sed -n 's/.*"tar_sha256": "\(.*\)".*/\1/p' $bundle/meta/MANIFEST.json)" ]; then
      say "install: the bundle is already in $site"
    else
      bash $bundle/meta/install.sh $bundle "$site" 2>&1 | tail -3 | tee -a "$summary" || { say "install failed"; exit 1; }
    fi
    rm -rf build/dmacoll_wheel
    "$py" -m pip wheel -q --no-deps --no-build-isolation --no-index -w build/dmacoll_wheel . > build/dmacoll_wheel.log 2>&1 \
      && "$py" -m pip install -q --no-deps --no-index --upgrade --target "$site" build/dmacoll_wheel/dmacoll-*.whl \
        >> build/dmacoll_wheel.log 2>&1 || { tail -20 build/dmacoll_wheel.log; say "dmacoll wheel failed"; exit 1; }
    "$py" -c 'import importlib.metadata as m; print("vllm", m.version("vllm"), "dmacoll entry points:",
      [e.value for e in m.entry_points(group="vllm.general_plugins")])' 2>&1 | tee -a "$summary" ;;
  tests)
    d=$out/vllm_tests/plugin; mkdir -p "$d"
    DMACOLL_REQUIRE_VLLM=1 timeout 400 "$py" -m pytest -q -p no:cacheprovider --junitxml="$d/junit.xml" \
      tests/test_vllm_plugin.py tests/test_vllm_model.py tests/test_vllm_check.py tests/gpu/test_vllm_gpu.py \
      > "$d/run.log" 2>&1
    tail -3 "$d/run.log" | tee -a "$summary"
    "$py" -m dmacoll_lab vllm results tests --out "$d/data.csv" "$d/junit.xml" | tee -a "$summary"
    rm -f "$d/junit.xml" ;;
  bench)  # the workflow's vLLM runs: rules vllm_model, vllm_bench, vllm_results with config/vllm_lent.yaml over the
    # machine's config, through lent_snakemake.sh (carry build/snakemake_bundle too), in a folder kept between calls:
    # a call that runs out of time stops, and `bench` in the next call on the warm machine goes on
    wf=$PWD/build/vllm_wf; d=$out/vllm/bench; mkdir -p "$d"
    timeout "${DEADLINE_S:-540}" bash tools/lent_snakemake.sh "$wf" auto ${VLLM_CONFIGS:-config/vllm_lent.yaml} \
      "$wf/vllm/bench/data.csv" --rerun-incomplete --nolock > "$d/snakemake.log" 2>&1 \
      || say "snakemake stopped (exit $?): run step bench again to go on (vllm/bench/snakemake.log)"
    grep -E "^[0-9]+ of [0-9]+ steps" "$d/snakemake.log" | tail -1 | tee -a "$summary"
    cp -r "$wf/vllm/bench/." "$d/" 2>/dev/null || true
    [ -f "$d/data.csv" ] && "$py" - "$d/data.csv" <<'EOF2' | tee -a "$summary"
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
for metric in ("latency_avg", "output_tokens_per_s"):
    m = df[df.metric == metric]
    if m.empty:
        continue
    runs = m.assign(run=m.source.str.rsplit("/", n=1).str[-1]).set_index("run")["value"].round(1)
    print(runs.to_string())
    med = m.groupby(["tp", "batch", "plugin"], dropna=False)["value"].median().unstack("plugin")
    if {"dma", "vllm"} <= set(med.columns):
        med["dma_over_vllm"] = med["dma"] / med["vllm"]
    print(metric, "medians over the rounds:"); print(med.round(4).to_string())
EOF2
    ;;
  check)
    d=$out/vllm_check/tp$tp; mkdir -p "$d"
    timeout "${DEADLINE_S:-500}" "$py" -m dmacoll_lab vllm check build/vllm_check --tp $tp ${REUSE:+--reuse} \
      >> "$d/run.log" 2>&1
    echo "exit $?" >> "$d/run.log"
    grep -E "^(ok|FAIL)|^exit" "$d/run.log" | tee -a "$summary"
    cp build/vllm_check/data.csv build/vllm_check/data.json "$d/" 2>/dev/null || say "vllm check wrote no table" ;;
  *) say "unknown step $step"; exit 2 ;;
esac
say "step $step: $(( $(date +%s) - t0 )) s"
done
tar czf "$dest/results.tgz" -C "$out" .
ls -la "$dest"
