#!/bin/bash
# bench/durability.sh: issue #6's figures for a 1 GiB shard, on one machine (loopback).
#
#   restart-to-serving: a psd holding ~1 GiB of fp32 state (an MLP [784, H, H, 10] with adam:
#     parameters + 2 moments) is killed with SIGKILL during training and started again with
#     the same command: seconds from exec to its "listening" line, to the first `psctl status`
#     answered, and to every parameter pulled (`psctl export`).
#   checkpoint: `psctl checkpoint` during training: its time, its throughput against a plain
#     `cp` of the store file measured in the same run, and the coordinator's step gaps
#     (step_gap_ms_max / median) of a run with one checkpoint against a run without.
#   disk: data.mdb bytes per state byte, checkpoint bytes per state byte.
#
# Usage: bench/durability.sh [BUILD_DIR]   (default build; env HIDDEN=9216 STEPS=6)
# Needs about 5 GiB of disk under $TMPDIR and 6 GiB of memory; takes a few minutes on 2 cores.
# Prints one JSON object; the figures are what this machine did once, not a guarantee.
set -euo pipefail
B=${1:-build}
H=${HIDDEN:-9216}
STEPS=${STEPS:-6}
W=$(mktemp -d "${TMPDIR:-/tmp}/psd-durability.XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT

# shellcheck source=../deploy/local/cluster-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../deploy/local/cluster-lib.sh" # free_port: below ephemeral
port=$(free_port)
M=$W/m.yaml
cat >"$M" <<EOF
cluster: durability
chunk_bytes: 1048576
map_size_mb: 8192
servers:
  - {host: 127.0.0.1, port: $port, data_dir: $W/data0}
job:
  model: mlp
  layers: [784, $H, $H, 10]
  batch_size: 32
  epochs: 1
  seed: 1
  workers: 1
  consistency: bsp
  max_steps: 1000
  optimizer: {name: adam, lr: 0.0001}
EOF

now() { date +%s.%N; }
ctl() { "$B/server/psctl" --manifest "$M" "$@"; }
jfield() { sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p" | head -1; }
start_psd() { # $1: log name; sets PSD; waits for the listening line
    "$B/server/psd" --manifest "$M" --shard 0 >"$W/$1.out" 2>"$W/$1.log" &
    PSD=$!
    PIDS+=("$PSD")
    until grep -q listening "$W/$1.out"; do
        kill -0 "$PSD" 2>/dev/null || { echo "psd exited: $(tail -3 "$W/$1.log")" >&2; exit 1; }
        sleep 0.01
    done
}
start_worker() {
    OPENBLAS_NUM_THREADS=1 "$B/worker/psworker" --manifest "$M" >"$W/$1.log" 2>&1 &
    WK=$!
    PIDS+=("$WK")
}
open_step() { ctl status --json --timeout 30 | jfield open_step; }
wait_step() { # until the open step reaches $1
    until [ "$(open_step)" -ge "$1" ]; do sleep 0.2; done
}

# ---- 1. a 1 GiB shard, killed during training and started again -----------------------------
start_psd psd1
start_worker w1
wait_step 2
state=$(ctl status --json | jfield state_bytes)
kill -9 "$PSD" "$WK"
wait "$PSD" "$WK" 2>/dev/null || true
t0=$(now)
"$B/server/psd" --manifest "$M" --shard 0 >"$W/psd2.out" 2>"$W/psd2.log" &
PSD=$!
PIDS+=("$PSD")
until grep -q listening "$W/psd2.out"; do sleep 0.001; done
t_listen=$(now)
until ctl status --json >/dev/null 2>&1; do sleep 0.001; done
t_status=$(now)
# --any-step: the worker was killed too, so a step it left part-pushed would wait for good
# (without it, 2 runs in 14 gave up: "no common step within 60 s").
ctl export --out "$W/params.safetensors" --timeout 60 --any-step >/dev/null
t_export=$(now)
data_bytes=$(stat -c %s "$W/data0/data.mdb")
data_du=$(du -B1 "$W/data0/data.mdb" | cut -f1)
params_bytes=$(stat -c %s "$W/params.safetensors")
rm -f "$W/params.safetensors"

# ---- 2. step gaps without a checkpoint, then with one ---------------------------------------
run_steps() { # $1: name, $2: checkpoint after this many steps (0: none)
    kill "$PSD" 2>/dev/null || true
    wait "$PSD" 2>/dev/null || true
    start_psd "psd-$1"
    start_worker "w-$1"
    local s0
    s0=$(open_step)
    if [ "$2" -gt 0 ]; then
        wait_step $((s0 + $2))
        local c0 c1
        c0=$(now)
        ctl checkpoint --dir "$W/ckpt" --timeout 60 >"$W/ckpt.out"
        c1=$(now)
        ckpt_s=$(echo "$c1 - $c0" | bc -l)
    fi
    wait_step $((s0 + STEPS))
    ctl status --json >"$W/status-$1.json"
    kill "$WK" 2>/dev/null || true
    wait "$WK" 2>/dev/null || true
}
ckpt_s=0
run_steps plain 0
run_steps ckpt 2
gap_max_plain=$(jfield step_gap_ms_max <"$W/status-plain.json")
gap_med_plain=$(jfield step_gap_ms_median <"$W/status-plain.json")
gap_max_ckpt=$(jfield step_gap_ms_max <"$W/status-ckpt.json")
gap_med_ckpt=$(jfield step_gap_ms_median <"$W/status-ckpt.json")
ckpt_bytes=$(du -sB1 "$W/ckpt" | cut -f1)
ckpt_ms_shard=$(sed -n 's/^shard 0: .* bytes, \([0-9]*\) ms:.*/\1/p' "$W/ckpt.out")

# The limit for the copy: cp of the same store file on the same file system, in the same run.
kill "$PSD" 2>/dev/null || true
wait "$PSD" 2>/dev/null || true
c0=$(now)
cp "$W/data0/data.mdb" "$W/copy.mdb"
sync "$W/copy.mdb"
c1=$(now)
cp_s=$(echo "$c1 - $c0" | bc -l)
cp_bytes=$(stat -c %s "$W/copy.mdb")
rm -f "$W/copy.mdb"

python3 - "$state" "$t0" "$t_listen" "$t_status" "$t_export" "$data_bytes" "$data_du" \
    "$params_bytes" "$ckpt_s" "$ckpt_ms_shard" "$ckpt_bytes" "$cp_s" "$cp_bytes" \
    "$gap_max_plain" "$gap_med_plain" "$gap_max_ckpt" "$gap_med_ckpt" <<'EOF'
import json, sys
a = sys.argv[1:]
state, t0, tl, ts, te = int(a[0]), float(a[1]), float(a[2]), float(a[3]), float(a[4])
data_bytes, data_du, params = int(a[5]), int(a[6]), int(a[7])
ckpt_s, ckpt_ms, ckpt_bytes = float(a[8]), int(a[9] or 0), int(a[10])
cp_s, cp_bytes = float(a[11]), int(a[12])
gmp, gmdp, gmc, gmdc = (int(x or 0) for x in a[13:17])
ckpt_gbs = ckpt_bytes / (ckpt_ms / 1000) / 1e9 if ckpt_ms else 0
cp_gbs = cp_bytes / cp_s / 1e9
print(json.dumps({
    "state_bytes": state,
    "restart_to_listening_s": round(tl - t0, 3),
    "restart_to_status_answered_s": round(ts - t0, 3),
    "restart_to_all_params_pulled_s": round(te - t0, 3),
    "all_params_bytes": params,
    "checkpoint_psctl_s": round(ckpt_s, 3),
    "checkpoint_shard_ms": ckpt_ms,
    "checkpoint_bytes": ckpt_bytes,
    "checkpoint_GBps": round(ckpt_gbs, 3),
    "cp_store_file_GBps": round(cp_gbs, 3),
    "checkpoint_vs_cp": round(ckpt_gbs / cp_gbs, 3) if cp_gbs else None,
    "step_gap_ms_max_without_checkpoint": gmp,
    "step_gap_ms_median_without_checkpoint": gmdp,
    "step_gap_ms_max_with_checkpoint": gmc,
    "step_gap_ms_median_with_checkpoint": gmdc,
    "data_mdb_bytes_per_state_byte": round(data_bytes / state, 3),
    "data_mdb_allocated_per_state_byte": round(data_du / state, 3),
    "checkpoint_bytes_per_state_byte": round(ckpt_bytes / state, 3),
}, indent=1))
EOF
