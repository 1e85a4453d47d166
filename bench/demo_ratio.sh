#!/usr/bin/env bash
# demo_ratio.sh: the training demo's samples/s on a local cluster (W workers x S shards, BSP,
# Adam, Fashion-MNIST MLP) against one process alone (psworker --local computing every rank's
# share), in the same run; the cluster twice: with fusion of small messages (the default) and
# without (fusion_bytes: 0). Each configuration runs --reps times, alternating; the median
# wall time of each is reported, and the ratios.
# Usage: bench/demo_ratio.sh [--epochs N] [--workers W] [--shards S] [--reps R] [--build DIR]
#        [--fused-only] [--chunk-bytes N] [--device cpu|cuda[:N]]
# (--build: the build directory whose binaries run, default build/ of this checkout;
# --device: every process computes there, the lone one and the cluster's workers alike;
# --fused-only: skip the fusion_bytes: 0 runs, e.g. for a build that predates fusion;
# --chunk-bytes: the manifest's chunk_bytes, default 262144 as the demo's)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
epochs=3 workers=4 shards=2 reps=3 build="" unfused=1 chunk=262144 device=cpu
while [ $# -gt 0 ]; do
    case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --fused-only) unfused=0; shift ;;
    --chunk-bytes) chunk=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    *) echo "usage: $0 [--epochs N] [--workers W] [--shards S] [--reps R] [--build DIR] [--fused-only] [--chunk-bytes N] [--device cpu|cuda[:N]]" >&2
       exit 2 ;;
    esac
done
if [ -z "$build" ]; then
    "$root/deploy/local/setup.sh" >/dev/null || exit 1
    build="$root/build"
fi
bin="$build"
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psd-ratio.XXXXXX")
. "$root/deploy/local/cluster-lib.sh"
psd_pids=()
cleanup() {
    stop_shards
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# manifest FILE FUSION: the demo's job for this run.
manifest() {
    {
        echo "cluster: ratio-$$-$RANDOM"
        echo "chunk_bytes: $chunk"
        [ "$2" = default ] || echo "fusion_bytes: $2"
        write_servers "$shards" "$tmp/data-$RANDOM"
        write_demo_job "$workers" "$epochs"
    } >"$1"
}

now() { date +%s.%N; }

# run_local / run_cluster FUSION: print the wall seconds of the training.
run_local() {
    manifest "$tmp/m.yaml" default
    local t0 t1
    t0=$(now)
    "$bin/worker/psworker" --manifest "$tmp/m.yaml" --local --device "$device" \
        --metrics-out "$tmp/local.jsonl" \
        >"$tmp/local.log" 2>&1 ||
        { cat "$tmp/local.log" >&2; return 1; }
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}'
}
# user + system seconds of every child this shell reaped so far, into $tmp/cpu.$1 ("times"
# must run in this shell: a command substitution would be a subshell with no children)
child_cpu() {
    times >"$tmp/times"
    tail -1 "$tmp/times" | awk '{for (i = 1; i <= 2; i++) {split($i, a, "m"); c += a[1] * 60 + a[2]}}
                                END {printf "%.3f", c}' >"$tmp/cpu.$1"
}
run_cluster() {
    child_cpu 0
    manifest "$tmp/m.yaml" "$1"
    start_shards "$tmp/m.yaml" "$shards" || return 1
    local t0 t1 rc
    t0=$(now)
    rm -rf "$tmp/metrics"
    mkdir -p "$tmp/metrics"
    "$bin/worker/pslaunch" --manifest "$tmp/m.yaml" --workers "$workers" --device "$device" \
        --metrics-dir "$tmp/metrics" >"$tmp/launch.log" 2>&1
    rc=$?
    t1=$(now)
    stop_shards
    rm -rf "$tmp"/data-*
    [ "$rc" = 0 ] || { tail -20 "$tmp/launch.log" >&2; return 1; }
    # CPU seconds of every process of the run (psd, pslaunch and its workers: all reaped)
    child_cpu 1
    awk -v a="$(cat "$tmp/cpu.0")" -v b="$(cat "$tmp/cpu.1")" 'BEGIN {printf "%.3f ", b - a}' \
        >"$tmp/cpu.last"
    awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}'
}
# steady FILES...: samples per second over epochs 2.., summed over the files' workers (each
# worker's epoch lines: samples it trained in the epoch and the epoch's wall time): the rate
# once every process has loaded its data and warmed up.
steady() {
    cat "$@" | awk '/"epoch"/ && !/"final"/ {
        e = $0; sub(/.*"epoch": /, "", e); sub(/,.*/, "", e)
        r = $0; sub(/.*"samples_per_s": /, "", r); sub(/,.*/, "", r)
        if (e + 0 >= 2) { sum[e] += r; n[e] = 1 } }
        END { t = 0; k = 0; for (e in sum) { t += sum[e]; k++ } printf "%.0f", k ? t / k : 0 }'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

: >"$tmp/local.r"; : >"$tmp/fused.r"; : >"$tmp/single.r"
: >"$tmp/local.t"; : >"$tmp/fused.t"; : >"$tmp/single.t"; : >"$tmp/fused.cpu"; : >"$tmp/single.cpu"
for ((r = 1; r <= reps; r++)); do
    run_local >>"$tmp/local.t" || exit 1
    echo "$(steady "$tmp/local.jsonl")" >>"$tmp/local.r"
    run_cluster default >>"$tmp/fused.t" || exit 1
    cat "$tmp/cpu.last" >>"$tmp/fused.cpu"
    echo "$(steady "$tmp"/metrics/*.jsonl)" >>"$tmp/fused.r"
    if [ "$unfused" = 1 ]; then
        run_cluster 0 >>"$tmp/single.t" || exit 1
        cat "$tmp/cpu.last" >>"$tmp/single.cpu"
        echo "$(steady "$tmp"/metrics/*.jsonl)" >>"$tmp/single.r"
    fi
    echo "demo_ratio: round $r of $reps: local $(tail -1 "$tmp/local.t") s, cluster" \
         "$(tail -1 "$tmp/fused.t") s (default), $(tail -1 "$tmp/single.t") s (fusion off)" >&2
done
tl=$(median <"$tmp/local.t"); tf=$(median <"$tmp/fused.t"); ts=$(median <"$tmp/single.t")
[ -n "$ts" ] || ts=1
cf=$(tr ' ' '\n' <"$tmp/fused.cpu" | grep . | median); cs=$(tr ' ' '\n' <"$tmp/single.cpu" | grep . | median)
samples=$((60000 * epochs))
rl=$(median <"$tmp/local.r"); rf=$(median <"$tmp/fused.r"); rs=$(median <"$tmp/single.r")
printf 'demo_ratio: %d epochs, %d workers x %d shards, on %s, median of %d (load average %s)\n' \
    "$epochs" "$workers" "$shards" "$device" "$reps" "$(cut -d' ' -f1 /proc/loadavg)"
printf '  %-36s %10s %14s %8s %14s %8s %8s\n' "" "wall s" "samples/s" "ratio" \
    "steady samp/s" "ratio" "CPU s"
row() { # name wall steady cpu
    awk -v n="$1" -v t="$2" -v r="$3" -v c="$4" -v tl="$tl" -v rl="$rl" -v s="$samples" \
        'BEGIN {if (r > 0 && rl > 0) printf "  %-36s %10.2f %14.0f %8.2f %14.0f %8.2f %8s\n",
                                          n, t, s / t, tl / t, r, r / rl, c;
                else printf "  %-36s %10.2f %14.0f %8.2f %14s %8s %8s\n", n, t, s / t, tl / t,
                            "- (1 epoch)", "-", c}'
}
row "one process alone (psworker --local)" "$tl" "$rl" "-"
row "cluster (default: fusion on)" "$tf" "$rf" "$cf"
[ "$unfused" = 1 ] && row "cluster, fusion_bytes: 0" "$ts" "$rs" "$cs"
exit 0
