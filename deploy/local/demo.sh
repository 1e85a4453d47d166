#!/usr/bin/env bash
# demo.sh: a local psd cluster on 127.0.0.1 — 2 shards and 4 workers train
# the Fashion-MNIST MLP for 10 epochs with BSP and Adam, printing progress.
# Data lives in a temporary directory; everything stops cleanly at the end
# or on Ctrl-C. Options: --workers N, --shards N, --epochs N, --keep (keep the
# temporary directory).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
workers=4 shards=2 epochs=10 keep=0
while [ $# -gt 0 ]; do
    case "$1" in
    --workers) workers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "demo: unknown option $1" >&2; exit 2 ;;
    esac
done
"$root/deploy/local/setup.sh" || exit 1
bin="$root/build"
export OPENBLAS_NUM_THREADS=1   # two cores are shared by every process of the cluster

tmp=$(mktemp -d "${TMPDIR:-/tmp}/psd-demo.XXXXXX")
. "$root/deploy/local/cluster-lib.sh"
psd_pids=()
launcher=""
by_int=0
cleanup() {
    trap - EXIT INT TERM
    if [ -n "$launcher" ]; then
        # A Ctrl-C reaches pslaunch too (the terminal signals the whole process group): it stops
        # its workers by itself, and a signal from here would be its second, on which it kills
        # them (SIGKILL). So it gets 5 s to exit first; a SIGINT sent to this shell alone ends
        # it then.
        if [ "$by_int" = 1 ]; then
            for _ in $(seq 50); do
                kill -0 "$launcher" 2>/dev/null || break
                sleep 0.1
            done
        fi
        kill -TERM "$launcher" 2>/dev/null
        wait "$launcher" 2>/dev/null
    fi
    stop_shards
    if [ "$keep" = 1 ]; then echo "demo: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
said_interrupted=0
interrupted() {
    if [ "$said_interrupted" = 0 ]; then
        said_interrupted=1
        echo; echo "demo: interrupted, stopping the cluster"
    fi
    exit "$1"
}
trap 'by_int=1; interrupted 130' INT
trap 'interrupted 143' TERM

{
    echo "cluster: demo"
    echo "chunk_bytes: 262144"
    write_servers "$shards" "$tmp"
    write_demo_job "$workers" "$epochs"
} >"$tmp/manifest.yaml"
echo "demo: manifest and data in $tmp"
start_shards "$tmp/manifest.yaml" "$shards" || exit 1
cat "$tmp"/psd*.out

mkdir -p "$tmp/metrics"
"$bin/worker/pslaunch" --manifest "$tmp/manifest.yaml" --workers "$workers" \
    --metrics-dir "$tmp/metrics" &
launcher=$!
wait "$launcher"
rc=$?
launcher=""
# A Ctrl-C reaches pslaunch too, which stops its workers and exits 128 + the signal, at times
# before this shell has run its trap: an interrupt, not a failure.
if [ $rc -eq 130 ] || [ $rc -eq 143 ]; then interrupted $rc; fi
if [ $rc -ne 0 ]; then
    echo "demo: a worker failed (exit $rc); shard logs:" >&2
    tail -n 5 "$tmp"/psd*.log >&2
    exit $rc
fi
acc=$(grep -h '"final": true' "$tmp"/metrics/*.jsonl | head -1 | sed 's/.*"test_accuracy": \([0-9.]*\).*/\1/')
echo "demo: done — $workers workers x $shards shards, final test accuracy $acc"
