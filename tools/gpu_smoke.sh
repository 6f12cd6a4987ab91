#!/usr/bin/env bash
# Kick the tires of every benchmark on this machine's GPUs in a few minutes: each one with tiny settings, every
# collective, every output checked as in a full run. What it writes is laid out as results/<machine>/ is
# (<experiment>/<run>/data.csv + data.json + run.log, under smoke/), packed into OUTDIR/results.tgz.
# Not reference results: the sizes are too few to read a trend from; a failure here is a bug to fix first.
# Usage (GPU machine, repo root): DMACOLL_GIT_SHA=<full sha> bash tools/gpu_smoke.sh OUTDIR
set -u
dest=${1:?output dir}; out=$dest/run/smoke
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ops="all_gather all_to_all all_to_all_v reduce_scatter all_reduce"
status=0
# step NAME COMMAND...: run one benchmark into smoke/NAME/, its console in run.log, say how it ended
step() {
  local name=$1; shift
  mkdir -p "$out/$name"
  local t0=$SECONDS
  if timeout 300 "$@" --out "$out/$name/data.csv" > "$out/$name/run.log" 2>&1; then
    echo "ok     $name ($((SECONDS - t0)) s)"
  else
    echo "FAILED $name ($((SECONDS - t0)) s): $(tail -n 3 "$out/$name/run.log" | tr '\n' ' ')"; status=1
  fi
}
step sweep python3 -m dmacoll_lab sweep --ops $ops --impls nccl dma peer_copy --variants pcpy b2b \
  --directions push pull --handshakes full lean --min-bytes 4K --max-bytes 1M --repeats 3 --calls 4
step sweep_nccl_ce python3 -m dmacoll_lab sweep --ops $ops --impls nccl_ce --min-bytes 4K --max-bytes 1M --repeats 3 \
  --calls 4
step c3 python3 -m dmacoll_lab c3 --shapes gemm:2048x8192x8192 membound:16384x8192 --ops $ops --targets 1 \
  --strategies baseline partition carveout dma dma_carveout --repeats 3
step interference python3 -m dmacoll_lab interference --sizes 4M --repeats 3
step ficco python3 -m dmacoll_lab ficco --models llama3-8b mixtral-8x7b --tokens 2048 --factors 1 2 --repeats 3
step power python3 -m dmacoll_lab power --ops $ops --sizes 1M --seconds 0.2 --idle-seconds 0.5 --repeats 1
step sm_usage python3 -m dmacoll_lab sm-usage --ops $ops --sizes 64K
step breakdown python3 -m dmacoll_lab breakdown --sizes 1K 1M --transfers 10
step e2e python3 -m dmacoll_lab e2e --models llama-3.1-8b mixtral-8x7b --layers 1 --batches 8 --prompts 128 \
  --decode-steps 4 --repeats 2
# every checked row must be right: the CSVs say so in their correct / logits_ok columns
python3 - "$out" <<'EOF' || status=1
import sys
from pathlib import Path

import pandas as pd

bad = []
for csv in sorted(Path(sys.argv[1]).glob("*/data.csv")):
    df = pd.read_csv(csv, keep_default_na=False)
    if "skipped" in df:  # a strategy this machine cannot run says why instead of measuring (not a wrong output)
        skipped = df[df["skipped"].astype(str) != ""]
        for why, n in skipped.groupby("skipped").size().items():
            print(f"{csv.parent.name:14s} {n} rows skipped: {why}")
        df = df[df["skipped"].astype(str) == ""]
    for col in ("correct", "logits_ok"):
        if col in df:
            checked = df[df[col].astype(str).isin(["True", "False"])]
            wrong = checked[checked[col].astype(str) == "False"]
            print(f"{csv.parent.name:14s} {len(df):5d} rows, {len(checked):5d} checked ({col}), {len(wrong)} wrong")
            bad += [csv.parent.name] * (len(wrong) > 0)
sys.exit(1 if bad else 0)
EOF
tar czf "$dest/results.tgz" -C "$dest/run" . && rm -r "$dest/run"
exit $status
