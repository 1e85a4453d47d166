#!/usr/bin/env bash
# elastic_stalls.sh: how long each kind of membership change holds up a BSP step.
# One run of 2 shards and 4 workers (Fashion-MNIST MLP); every ~2 s one event: kill -9 a
# worker, SIGTERM a worker (graceful leave), start a worker (join), SIGSTOP a worker (past
# job.heartbeat_timeout_ms, then SIGCONT: it rejoins), psctl scale down. The coordinator keeps
# the longest step-to-step gaps with their steps (psctl status --json: step_gaps_top); each is
# matched with the event logged at that step. The figure beside each: the median step of the
# same run, and the heartbeat timeout.
# Usage: bench/elastic_stalls.sh [--heartbeat-ms N] [--build DIR]
# (--build: the build whose psd, psctl and psworker run; default build/, made by setup.sh)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
hb=1000
bin=""
while [ $# -gt 0 ]; do
    case "$1" in
    --heartbeat-ms) hb=${2:?--heartbeat-ms N}; shift 2 ;;
    --build) bin=$(cd "${2:?--build DIR}" && pwd) || exit 2; shift 2 ;;
    *) echo "usage: $0 [--heartbeat-ms N] [--build DIR]" >&2; exit 2 ;;
    esac
done
if [ -z "$bin" ]; then
    "$root/deploy/local/setup.sh" || exit 1
    bin="$root/build"
fi
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psd-stall.XXXXXX")
. "$root/deploy/local/cluster-lib.sh"
psd_pids=()
workers=()
cleanup() {
    for p in "${workers[@]}"; do kill -KILL "$p" 2>/dev/null; done
    stop_shards
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

m="$tmp/manifest.yaml"
{
    echo "cluster: stall-$$"
    echo "chunk_bytes: 65536"
    echo "map_size_mb: 256"
    write_servers 2 "$tmp"
    cat <<EOF
job:
  model: mlp
  batch_size: 32
  epochs: 100
  workers: 4
  heartbeat_timeout_ms: $hb
  optimizer: {name: sgd, lr: 0.05}
EOF
} >"$m"
start_shards "$m" 2 || exit 1
start_worker() {
    "$bin/worker/psworker" --manifest "$m" >"$tmp/w$1.log" 2>&1 &
    workers[$1]=$!
}
for i in 0 1 2 3; do start_worker "$i"; done
status() { "$bin/server/psctl" --manifest "$m" status --json; }
step() { status | grep -o '"open_step": [0-9]*' | grep -o '[0-9]*$'; }
sleep 3
echo "kill -9 worker 3 at step $(step)"; kill -KILL "${workers[3]}"; sleep 2
echo "SIGTERM worker 2 at step $(step)"; kill -TERM "${workers[2]}"; sleep 2
echo "join worker 4 at step $(step)"; start_worker 4; sleep 3
echo "SIGSTOP worker 1 at step $(step)"; kill -STOP "${workers[1]}"; sleep $(( (hb + 1999) / 1000 ))
echo "SIGCONT worker 1 at step $(step)"; kill -CONT "${workers[1]}"; sleep 3
echo "scale 4 -> 1 (SIGTERM workers 1 and 4) at step $(step)"
"$bin/server/psctl" --manifest "$m" scale 1 >/dev/null
kill -TERM "${workers[4]}" "${workers[1]}" 2>/dev/null; sleep 2
j=$(status)
echo
echo "median step: $(grep -o '"step_gap_ms_median": [0-9]*' <<<"$j" | grep -o '[0-9]*$') ms," \
    "heartbeat timeout: $hb ms"
echo "longest gaps (step: ms) and the coordinator's log at that step:"
grep -o '"step_gaps_top": \[[^]]*\]' <<<"$j" | grep -o '{[^}]*}' |
    sed 's/{"step": \([0-9]*\), "ms": \([0-9]*\)}/\1 \2/' | sort -k2 -n -r |
    while read -r s ms; do
        ev=$(grep -E "coord .*(at step $s[^0-9]|step $s has)" "$tmp/psd0.log" | grep -v "takes part" |
             sed 's/.*coord *//' | head -2 | paste -sd ';' -)
        printf '  step %6s: %5s ms  %s\n' "$s" "$ms" "${ev:-(no membership change)}"
    done
