#!/usr/bin/env bash
# vLLM with the dmacoll plugin on a lent GPU machine (no network), after the bundle's pieces arrived.
# Usage (device machine, repo root): DMACOLL_GIT_SHA=<full sha> [TP=n] bash tools/vllm_gpu_run.sh OUTDIR [STEP...]
#   STEP: install  check, join and install the bundle (build/vllm_bundle/, from `tools/vllm_bundle.py`) into
#                  build/vllm_site, and dmacoll as a distribution beside it (a wheel built here: vLLM finds the
#                  plugin through its `vllm.general_plugins` entry point); skipped when already done
#         tests    the plugin's tests against that vLLM (the CPU ones and tests/gpu/test_vllm_gpu.py)
#         bench    `vllm bench latency` at TP (default 1), Llama-3.1-8B with dummy weights, DMACOLL_VLLM=0 and =1
#                  alternating (REPS rounds, batch BATCH; odd rounds plugin off first, even rounds on first: the
#                  second vLLM start of a round ran 2-6% slower); at TP 1 the plugin routes nothing: the two must
#                  agree within noise
#         throughput  `vllm bench throughput` at TP, 200 prompts of 128 in and 128 out, plugin off and on
#         check    `dmacoll vllm check` at TP (2 or more): outputs with the plugin off and on (five vLLM starts,
#                  about 100 s each at TP 4: REUSE=1 in a second call goes on from the settings a first one finished)
#   default: install tests bench. Each step's time is printed; split the steps over calls to stay inside 10 minutes
#   (build/ stays on a warm machine between calls). Each vLLM start costs about 1-2 minutes.
# Out: OUTDIR/results.tgz laid out as results/<machine>/ is (vllm/<run>/{data.csv,data.json,run.log}; unpack with
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
models=build/vllm_models/llama-3.1-8b
model() { [ -f $models/tokenizer.json ] || "$py" -m dmacoll_lab vllm model $models --model llama-3.1-8b >> "$1" 2>&1; }
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
  bench)
    d=$out/vllm/tp${tp}_latency; raw=build/vllm_raw; mkdir -p "$d"; rm -rf $raw; model "$d/run.log"
    for rep in $(seq 1 "${REPS:-2}"); do
      order="vllm dma"; [ $((rep % 2)) -eq 0 ] && order="dma vllm"  # the second start of a call runs 2-6% slower
      for plugin in $order; do
        name=latency_llama-3.1-8b_tp${tp}_b${BATCH:-8}_i128_${plugin}_r$rep
        echo "== $name ($(date -u +%T))" >> "$d/run.log"
        timeout 240 "$py" -m dmacoll_lab vllm bench --model-dir $models --out-json $raw/$name.json --name $name \
          --bench latency --model-name llama-3.1-8b --spec llama-3.1-8b --tp $tp --plugin $plugin \
          --batch "${BATCH:-8}" --input-len 128 --output-len 128 --warmup 3 --iters "${ITERS:-10}" >> "$d/run.log" 2>&1 \
          || say "$name failed (exit $?): see vllm/tp${tp}_latency/run.log"
      done
    done
    "$py" -m dmacoll_lab vllm results csv --out "$d/data.csv" $raw/*.json >> "$d/run.log" 2>&1 || say "no results"
    "$py" - "$d/data.csv" <<'EOF' | tee -a "$summary"
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
lat = df[df.metric == "latency_avg"]
for r in lat.itertuples():
    print(f"{r.source.rsplit('/', 1)[-1]}: {r.value:.1f} ms, vllm {r.vllm_version}, registered {r.plugin_registered}, "
          f"routed '{'' if pd.isna(r.dmacoll_routed) else r.dmacoll_routed}'")
m = lat.groupby("plugin")["value"].agg(["median", "min", "max"])
print(m.round(1).to_string())
if {"dma", "vllm"} <= set(m.index):
    spread = (lat.groupby("plugin")["value"].max() - lat.groupby("plugin")["value"].min()).max()
    print(f"dma / vllm median {m.loc['dma', 'median'] / m.loc['vllm', 'median']:.4f}; "
          f"largest spread within one setting {spread:.1f} ms")
EOF
    ;;
  throughput)
    d=$out/vllm/tp${tp}_throughput; raw=build/vllm_raw_throughput; mkdir -p "$d"; rm -rf $raw; model "$d/run.log"
    for plugin in ${ORDER:-vllm dma}; do  # ORDER="dma vllm": the plugin's run first (the second start runs slower)
      name=throughput_llama-3.1-8b_tp${tp}_n200_i128_$plugin
      timeout 250 "$py" -m dmacoll_lab vllm bench --model-dir $models --out-json $raw/$name.json --name $name \
        --bench throughput --model-name llama-3.1-8b --spec llama-3.1-8b --tp $tp --plugin $plugin \
        --input-len 128 --output-len 128 --num-prompts 200 >> "$d/run.log" 2>&1 || say "$name failed (exit $?)"
    done
    "$py" -m dmacoll_lab vllm results csv --out "$d/data.csv" $raw/*.json >> "$d/run.log" 2>&1 || say "no results"
    "$py" -c 'import sys, pandas as pd; df = pd.read_csv(sys.argv[1])
print(df[df.metric == "tokens_per_s"][["plugin", "value", "plugin_registered"]].to_string(index=False))' \
      "$d/data.csv" | tee -a "$summary" ;;
  check)
    d=$out/vllm_check/tp$tp; mkdir -p "$d"
    timeout 500 "$py" -m dmacoll_lab vllm check build/vllm_check --tp $tp ${REUSE:+--reuse} >> "$d/run.log" 2>&1
    echo "exit $?" >> "$d/run.log"
    grep -E "^(ok|FAIL)|^exit" "$d/run.log" | tee -a "$summary"
    cp build/vllm_check/data.csv build/vllm_check/data.json "$d/" 2>/dev/null || say "vllm check wrote no table" ;;
  *) say "unknown step $step"; exit 2 ;;
esac
say "step $step: $(( $(date +%s) - t0 )) s"
done
tar czf "$dest/results.tgz" -C "$out" .
ls -la "$dest"
