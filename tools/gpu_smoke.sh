#!/usr/bin/env bash
# Kick the tires of every experiment on a lent machine's GPUs in a few minutes: the workflow's rules with
# config/kick.yaml (tiny settings, every collective) through lent_snakemake.sh (carry build/snakemake_bundle), then
# every checked row of every output must be right (its correct / logits_ok columns). Laid out as results/<machine>/
# is (<experiment>/<run>/data.csv + data.json + run.log, under smoke/), packed into OUTDIR/results.tgz.
# Not reference results: the sizes are too few to read a trend from; a failure here is a bug to fix first.
# Usage (GPU machine, repo root): DMACOLL_GIT_SHA=<full sha> [DEADLINE_S=540] bash tools/gpu_smoke.sh OUTDIR
set -u
dest=${1:?output dir}; out=$dest/run/smoke
# every rule runs a rank per GPU and a collective needs two: one GPU has its own commands
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ -z "${CUDA_VISIBLE_DEVICES+set}" ] || gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
[ "$gpus" -ge 2 ] || { echo "gpu_smoke: the collectives need 2 or more GPUs; $gpus visible. On one GPU:" \
  "tools/gpu_suite.sh (ranks sharing it) and tools/lent_snakemake.sh OUTDIR auto config/probes.yaml measure_probes" >&2
  exit 2; }
mkdir -p "$out"
status=0
timeout "${DEADLINE_S:-540}" bash tools/lent_snakemake.sh "$out" auto config/kick.yaml measure_operator \
  measure_breakdown measure_resources measure_c3 measure_ficco measure_e2e --keep-going > "$dest/snakemake.log" 2>&1 \
  || { echo "FAILED: snakemake (exit $?): $(grep -E 'Error in rule|^[0-9]+ of [0-9]+ steps' "$dest/snakemake.log" \
       | tail -n 4 | tr '\n' ' ')"; status=1; }
grep -E "^[0-9]+ of [0-9]+ steps" "$dest/snakemake.log" | tail -1
# every checked row must be right: the CSVs say so in their correct / logits_ok columns
python3 - "$out" <<'EOF' || status=1
import sys
from pathlib import Path

import pandas as pd

bad = []
for csv in sorted(Path(sys.argv[1]).glob("*/*/data.csv")):
    name = f"{csv.parent.parent.name}/{csv.parent.name}"
    df = pd.read_csv(csv, keep_default_na=False)
    if "skipped" in df:  # a strategy this machine cannot run says why instead of measuring (not a wrong output)
        skipped = df[df["skipped"].astype(str) != ""]
        for why, n in skipped.groupby("skipped").size().items():
            print(f"{name:28s} {n} rows skipped: {why}")
        df = df[df["skipped"].astype(str) == ""]
    for col in ("correct", "logits_ok"):
        if col in df:
            checked = df[df[col].astype(str).isin(["True", "False"])]
            wrong = checked[checked[col].astype(str) == "False"]
            print(f"{name:28s} {len(df):5d} rows, {len(checked):5d} checked ({col}), {len(wrong)} wrong")
            bad += [name] * (len(wrong) > 0)
sys.exit(1 if bad else 0)
EOF
tar czf "$dest/results.tgz" -C "$dest/run" . && rm -r "$dest/run"
exit $status
