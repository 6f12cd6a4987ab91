#!/usr/bin/env bash
# Snakemake targets on a lent GPU machine (no network, one command of at most 10 minutes): Snakemake from the
# carried bundle, every GPU the machine has, the multicast-off settings, results under OUTDIR. The rules and their
# parameters are the workflow's (config/config.yaml and the machine's config), so a run names the rule that made it.
#
#   on a machine with network:  python3 tools/vllm_bundle.py build/snakemake_bundle --root snakemake==9.27.1
#   on the lent machine (carry build/snakemake_bundle with the tree):
#     bash tools/lent_snakemake.sh OUTDIR config/h200x4.yaml [more.yaml ...] [snakemake arguments: targets, -n, ...]
#   (more config files after the machine's, each over the one before: config/vllm_lent.yaml for vLLM's runs;
#   `auto` for the machine's: config/h200x<GPUs>.yaml where there is one, else config/config.yaml alone; GPUs: those
#   CUDA_VISIBLE_DEVICES names where it is set, e.g. CUDA_VISIBLE_DEVICES=0,1 for world 2 on a 4-GPU machine)
#   e.g. targets OUTDIR/sm_path/default_call_small_run1/data.csv (rule default_call), one call's worth at a time
set -euo pipefail
out=${1:?usage: lent_snakemake.sh OUTDIR config/MACHINE.yaml [snakemake arguments]}
machine=${2:?usage: lent_snakemake.sh OUTDIR config/MACHINE.yaml [snakemake arguments]}
shift 2
configs=()
while [ $# -gt 0 ] && [[ $1 == *.yaml ]]; do configs+=("$1"); shift; done
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${DMACOLL_SNAKEMAKE_BUNDLE:-$root/build/snakemake_bundle}
site=${DMACOLL_SNAKEMAKE_SITE:-/tmp/dmacoll_snakemake}
if ! python3 -c "import snakemake" 2>/dev/null && ! PYTHONPATH=$site python3 -c "import snakemake" 2>/dev/null; then
  [ -f "$bundle/meta/install.sh" ] || { echo "no snakemake here and no bundle at $bundle (see the top of $0)" >&2; exit 2; }
  bash "$bundle/meta/install.sh" "$bundle" "$site"
fi
export PYTHONPATH=$root/src:$site${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$gpus" -gt 0 ] || { echo "nvidia-smi lists no GPU: this script measures; make artifact renders without GPUs" >&2; exit 2; }
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then  # part of the machine (2 of 4 GPUs): the rules' world is what is visible
  visible=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
  [ "$visible" -gt 0 ] && [ "$visible" -le "$gpus" ] \
    || { echo "CUDA_VISIBLE_DEVICES names $visible GPUs; the machine has $gpus" >&2; exit 2; }
  gpus=$visible
fi
cd "$root"
if [ "$machine" = auto ]; then  # the rules' machine settings; the GPU model makes no difference to the rules
  machine=config/h200x$gpus.yaml; [ -f "$machine" ] || machine=config/config.yaml
fi
configs=("$machine" ${configs[@]+"${configs[@]}"})
mkdir -p "$out"
bash tools/machine_probe.sh > "$out/probe.txt" 2>&1 || true  # the call's machine, beside its runs
echo "lent_snakemake: $gpus GPUs, ${configs[*]}, results under $out" >&2
# the caller's arguments first: --configfile, --config and --resources each take every word up to the next option
exec python3 -m snakemake "$@" --profile profiles/local --configfile config/config.yaml "${configs[@]}" \
  --config outdir="$out" gpus="$gpus" --resources gpu="$gpus"
