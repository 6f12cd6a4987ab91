#!/usr/bin/env bash
# One-GPU work spread over every visible GPU: a lane per GPU, each lane's commands seeing only its GPU
# (CUDA_VISIBLE_DEVICES), so a machine with n GPUs runs n one-GPU runs at once (ranks share their lane's GPU through
# the IPC heap). The lanes take items from one queue, in its order (put the longest first); a lane starts an item
# only while the item's limit fits before DEADLINE_S, else it looks further down for one that fits. Finished items are
# recorded in STATE, so the same command again on the same warm machine goes on where the last call stopped.
# PIN=0: one lane seeing every GPU instead (the ranks of an item get a GPU each where there are enough).
# Each lane's share of the CPU cores is its OMP_NUM_THREADS (four ranks per lane; with 64 threads per rank, four
# lanes of four ranks on 64 cores ran their CPU references 2-3x slower than two lanes did).
# Usage (device machine, repo root): [DEADLINE_S=560] [LANES=n] [PIN=0] bash tools/gpu_lanes.sh STATE QUEUE LOG
#   QUEUE: a line per item, "LIMIT_S NAME COMMAND..." (NAME unique, no spaces; COMMAND runs under bash -c);
#   '#' lines are skipped. STATE: a folder (keep it under build/: ignored, so it stays between calls).
#   LOG: "VERDICT SECONDS gpuN|all-gpus NAME" per item as it ends (PASS, FAIL, TIMEOUT, SKIP for a pytest item
#   that skipped); each item's output goes to STATE/logs/NAME.log, a failure's tail also into LOG.
set -u
state=$1 queue=$2 log=$3
mkdir -p "$state/logs"; : > "$state/claimed"; touch "$state/done"
pin=${PIN:-1} lanes=${LANES:-$(nvidia-smi -L | wc -l)} deadline=${DEADLINE_S:-560} start=$SECONDS
[ "$pin" = 1 ] || lanes=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / (4 * lanes) > 0 ? $(nproc) / (4 * lanes) : 1 ))}

# next_item: the first queued item neither done nor claimed whose limit fits the time left; claimed under a lock
next_item() {
  local left=$((deadline - (SECONDS - start)))
  flock "$state/claimed" awk -v left="$left" -v claimed="$state/claimed" -v done="$state/done" '
    FILENAME == done { taken[$4] = 1; next }
    FILENAME == claimed { taken[$1] = 1; next }
    /^#/ || NF < 3 || ($2 in taken) { next }
    $1 + 0 <= left { print; print $2 >> claimed; exit }' "$state/done" "$state/claimed" "$queue"
}

lane() {
  local gpu=$1 item limit name cmd t0 rc verdict vis=() where=all-gpus
  [ "$pin" = 1 ] && vis=("CUDA_VISIBLE_DEVICES=$gpu") && where=gpu$gpu
  while item=$(next_item) && [ -n "$item" ]; do
    read -r limit name cmd <<<"$item"
    t0=$SECONDS
    # the ranks' own deadline comes before the lane's, so a hung item prints its ranks' stacks (launch.py)
    env "${vis[@]}" DMACOLL_RANK_DEADLINE_S=$((limit - 15)) \
      timeout "$limit" bash -c "$cmd" > "$state/logs/$name.log" 2>&1; rc=$?
    case $rc in 0) verdict=PASS;; 124) verdict=TIMEOUT;; *) verdict=FAIL;; esac
    grep -qE "^(=+ )?[0-9]+ skipped in" "$state/logs/$name.log" && verdict=SKIP
    flock "$state/claimed" sh -c "echo '$verdict $((SECONDS - t0))s $where $name' | tee -a '$log' >> '$state/done'"
    [ "$verdict" = PASS ] || tail -30 "$state/logs/$name.log" | cut -c1-400 | sed "s/^/    [$name] /" >> "$log"
  done
}

for ((g = 0; g < lanes; g++)); do lane "$g" & done
wait
left=$(awk -v done="$state/done" 'FILENAME == done { d[$4] = 1; next } !/^#/ && NF >= 3 && !($2 in d)' \
  "$state/done" "$queue" | wc -l)
echo "lanes ended after $((SECONDS - start)) s; $left item(s) not run yet" | tee -a "$log"
