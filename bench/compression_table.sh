#!/usr/bin/env bash
# compression_table.sh: train the Fashion-MNIST MLP with 4 workers x 2 shards for each
# gradient codec and several seeds, and write docs/COMPRESSION.md: mean and spread of
# the final test accuracy, bytes pushed per step, reduction against fp32, epoch time.
# Usage: bench/compression_table.sh [--epochs N] [--seeds "1 2 3"] [--out FILE]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
epochs=10 seeds="1 2 3" out="$root/docs/COMPRESSION.md" only=""
while [ $# -gt 0 ]; do
    case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;  # a comma list of config names, e.g. "fp32,int8"
    *) echo "usage: $0 [--epochs N] [--seeds \"1 2 3\"] [--out FILE] [--only \"fp32,int8\"]" >&2
       exit 2 ;;
    esac
done
"$root/deploy/local/setup.sh" || exit 1
bin="$root/build"
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psd-cmp.XXXXXX")
. "$root/deploy/local/cluster-lib.sh"
psd_pids=()
trap 'stop_shards; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# name | codec | error feedback | more compression keys
configs=(
    "fp32|none|true"
    "fp16|fp16|true"
    "bf16|bf16|true"
    "int8|int8|true"
    "topk 0.1|topk:0.1|true"
    "topk 0.1, no EF|topk:0.1|false"
    "topk 0.05, fp16 values|topk:0.05|true|, fp16_values: true"
    "topk 0.01|topk:0.01|true"
    "topk 0.01, no EF|topk:0.01|false"
    "topk 0.001|topk:0.001|true"
    "topk 0.001, no EF|topk:0.001|false"
    "randomk 0.01|randomk:0.01|true"
    "sign|sign|true"
)

# --only naming no config at all (a typo) is refused before anything runs: it wrote an empty
# table and exited 0 (a probe, session 56).
if [ -n "$only" ]; then
    matched=0
    for cfg in "${configs[@]}"; do
        IFS='|' read -r name _ <<<"$cfg"
        [[ ",$only," == *",$name,"* ]] && matched=1
    done
    if [ "$matched" = 0 ]; then
        echo "$0: --only \"$only\" names none of the configs:" >&2
        for cfg in "${configs[@]}"; do echo "  ${cfg%%|*}" >&2; done
        exit 2
    fi
fi

results="$tmp/results.tsv"
: >"$results"
for cfg in "${configs[@]}"; do
    IFS='|' read -r name codec ef extra <<<"$cfg"
    if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then continue; fi
    for seed in $seeds; do
        run="$tmp/run"
        rm -rf "$run"
        mkdir -p "$run/metrics"
        {
            echo "cluster: cmp"
            echo "chunk_bytes: 1048576"
            write_servers 2 "$run"
            cat <<YAML
job:
  model: mlp
  batch_size: 64
  epochs: $epochs
  seed: $seed
  workers: 4
  optimizer: {name: adam, lr: 0.001, schedule: cosine}
  compression: {codec: "$codec", error_feedback: $ef$extra}
YAML
        } >"$run/manifest.yaml"
        start_shards "$run/manifest.yaml" 2 || exit 1
        if ! "$bin/worker/pslaunch" --manifest "$run/manifest.yaml" --workers 4 \
            --metrics-dir "$run/metrics" 2>"$run/workers.log"; then
            echo "$name seed $seed: a worker failed" >&2
            tail -n 5 "$run/workers.log" >&2
            exit 1
        fi
        stop_shards
        # accuracy (rank 0's final line), pushed bytes of all workers, raw bytes, steps, wall
        acc=$(grep -h '"final": true' "$run"/metrics/*.jsonl | head -1 |
            sed 's/.*"test_accuracy": \([0-9.]*\).*/\1/')
        awk -v name="$name" -v seed="$seed" -v acc="$acc" -v epochs="$epochs" '
            /"epoch"/ { last[FILENAME] = $0 }
            END {
                for (f in last) {
                    l = last[f]
                    match(l, /"bytes_pushed": [0-9]+/); bp += substr(l, RSTART + 16, RLENGTH - 16)
                    match(l, /"bytes_pushed_raw": [0-9]+/); br += substr(l, RSTART + 20, RLENGTH - 20)
                    match(l, /"step": [0-9]+/); steps = substr(l, RSTART + 8, RLENGTH - 8)
                    match(l, /"wall_s": [0-9.]+/); w = substr(l, RSTART + 10, RLENGTH - 10)
                    if (w > wall) wall = w
                }
                printf "%s\t%s\t%s\t%.0f\t%.0f\t%.3f\n", name, seed, acc, bp / steps, br / steps, wall / epochs
            }' "$run"/metrics/*.jsonl >>"$results"
        tail -n 1 "$results"
    done
done

# The table: mean and spread (min..max) over seeds, reduction against fp32's bytes.
awk -F'\t' -v epochs="$epochs" -v seeds="$seeds" '
    { n[$1]++; s[$1] += $3; if (!($1 in lo) || $3 < lo[$1]) lo[$1] = $3; if (!($1 in hi) || $3 > hi[$1]) hi[$1] = $3
      b[$1] += $4; t[$1] += $6; if (!($1 in order)) { order[$1] = ++k; names[k] = $1 } }
    END {
        base = b["fp32"] / n["fp32"]; acc0 = s["fp32"] / n["fp32"]
        print "# Gradient compression: accuracy and traffic\n"
        print "Fashion-MNIST MLP 784-256-128-10, 4 workers x 2 shards on one 2-core machine, bsp, Adam"
        print "lr 0.001 with cosine decay to 0 over the run (so each run ends on a settled model),"
        print "batch 64 per worker, " epochs " epochs, seeds " seeds ". Tensors under 16 KiB"
        print "(the biases and the 128 x 10 last layer) travel uncompressed (`min_bytes`). Produced by `bench/compression_table.sh`.\n"
        print "| codec | test accuracy, mean | min..max | vs fp32 (pp) | bytes pushed / step (all workers) | reduction vs fp32 | s / epoch |"
        print "| --- | --- | --- | --- | --- | --- | --- |"
        for (i = 1; i <= k; i++) {
            c = names[i]; m = s[c] / n[c]; bb = b[c] / n[c]
            printf "| %s | %.4f | %.4f..%.4f | %+.2f | %.0f | %.1f%% | %.2f |\n", c, m, lo[c], hi[c], (m - acc0) * 100, bb, (1 - bb / base) * 100, t[c] / n[c]
        }
        printf "\nEvery codec runs the same seeds as fp32, so \"vs fp32\" is the mean paired difference. "
        printf "The seeds alone spread fp32 over %.2f pp (min..max), so differences of a tenth of a ", (hi["fp32"] - lo["fp32"]) * 100
        printf "point need more seeds to resolve. Bytes are exact counts from the workers; seconds "
        printf "per epoch are wall time on a shared 2-core machine and move with whatever else runs.\n"
    }' "$results" >"$out.new" || exit 1
# Sections written by hand after the table (a "## " heading on) are kept.
if [ -f "$out" ] && grep -q '^## ' "$out"; then
    { echo; sed -n '/^## /,$p' "$out"; } >>"$out.new" || exit 1
fi
mv "$out.new" "$out" || exit 1
echo "wrote $out"
cat "$out"
