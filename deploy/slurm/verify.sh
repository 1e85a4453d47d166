#!/usr/bin/env bash
# verify.sh [BUILD_DIR]: runs deploy/slurm/psd.sbatch end to end on this host, with stand-ins
# for Slurm's srun and scontrol (a "node list" of two 127.0.0.1 entries): the manifest made from
# the nodes, two psd shards started by psd-shard.sh, one of them killed with SIGKILL mid-run and
# started again, two `pslaunch --follow` training a small job to its end, every psd stopped.
# Also: a template that has servers: is refused. Exit 0 when all of it holds.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psd-slurm.XXXXXX")
cleanup() {
    pkill -KILL -f "$tmp/" 2>/dev/null
    if [ -n "${PSD_VERIFY_KEEP:-}" ]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
fail() { echo "verify.sh: FAIL: $*" >&2; [ -f "$tmp/out" ] && tail -40 "$tmp/out" >&2; exit 1; }

mkdir -p "$tmp/bin"
# scontrol show hostnames LIST: one name a line (a comma-separated LIST only).
cat > "$tmp/bin/scontrol" <<'S'
#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] || { echo "scontrol stand-in: only 'show hostnames'" >&2; exit 1; }
tr ',' '\n' <<< "$3"
S
# srun [--opt=value...] CMD ARGS: --ntasks copies of CMD on this host, SLURM_PROCID 0..n-1;
# as Slurm's srun, SIGTERM kills every task (SIGKILL, "forcing job termination"), and SIGINT
# goes to every task with --disable-status (without it, a single one only prints the status);
# the status is the highest task status.
cat > "$tmp/bin/srun" <<'S'
#!/usr/bin/env bash
# psd.sbatch starts it in the background, where a script has SIGINT ignored and cannot trap
# it; Slurm's srun, a program, catches it: run again with SIGINT at its default (same pid).
[ -z "$SRUN_SIGINT" ] && SRUN_SIGINT=1 exec env --default-signal=INT "$0" "$@"
n=1 fwd=0
while [ $# -gt 0 ]; do
    case "$1" in
    --ntasks=*) n=${1#--ntasks=} ;;
    --disable-status | -X) fwd=1 ;;
    --*) ;;
    *) break ;;
    esac
    shift
done
pids=()
# A background job of a script starts with SIGINT ignored (and a shell script cannot trap it
# then): slurmstepd's tasks do not.
for ((i = 0; i < n; i++)); do SLURM_PROCID=$i env --default-signal=INT "$@" & pids+=($!); done
trap 'echo "srun: forcing job termination" >&2; kill -KILL "${pids[@]}" 2>/dev/null' TERM
trap '[ "$fwd" = 1 ] && kill -INT "${pids[@]}" 2>/dev/null' INT
rc=0
for p in "${pids[@]}"; do
    while wait "$p"; s=$?; kill -0 "$p" 2>/dev/null; do :; done
    [ "$s" -gt "$rc" ] && rc=$s
done
exit "$rc"
S
chmod +x "$tmp/bin/scontrol" "$tmp/bin/srun"
export PATH=$tmp/bin:$PATH

# Two free ports in a row for the shards, two for their metrics.
free_pair() {
    for _ in $(seq 100); do
        p=$((20000 + RANDOM % 12000)) # below the kernel's ephemeral ports (32768-)
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
        (exec 3<>"/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null && continue
        echo "$p"
        return
    done
    echo 0
}
port=$(free_pair)
mport=$(free_pair)
[ "$mport" -ne "$port" ] && [ "$mport" -ne $((port + 1)) ] && [ "$port" -ne $((mport + 1)) ] ||
    mport=$(free_pair)

# The psd_step a shard's /metrics on 127.0.0.1:$1 shows ("" while it does not answer).
shard_step() {
    local st
    st=$({ exec 3<>"/dev/tcp/127.0.0.1/$1" &&
           printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3; } 2>/dev/null)
    sed -n 's/^psd_step{[^}]*} //p' <<< "$st" | tr -d '\r'
}

cat > "$tmp/job.yaml" <<Y
cluster: slurm-verify-$$
chunk_bytes: 65536
map_size_mb: 64
job:
  model: mlp
  layers: [784, 64, 10]
  batch_size: 32
  epochs: 1
  workers: 2
  consistency: bsp
  max_steps: 600
  optimizer: {name: sgd, lr: 0.05}
Y
export SLURM_JOB_NODELIST=127.0.0.1,127.0.0.1 SLURM_JOB_ID=$$ SLURM_SUBMIT_DIR=$tmp
export PSD_BUILD=$build PSD_PORT=$port PSD_METRICS_PORT=$mport PSD_DATA=$tmp/data
export PSD_RUN_DIR=$tmp/run PS_DATASET_CACHE=off

"$root/deploy/slurm/psd.sbatch" "$tmp/job.yaml" > "$tmp/out" 2>&1 &
job_pid=$!
# Once training is under way, kill shard 1 with SIGKILL: psd-shard.sh must start it again.
killed=0
for _ in $(seq 600); do
    kill -0 "$job_pid" 2>/dev/null || break
    if [ "$killed" -eq 0 ]; then
        step=$(shard_step $((mport + 1)))
        if [ -n "$step" ] && [ "$step" -ge 50 ]; then
            pid=$(pgrep -f "$tmp/run/manifest.yaml --shard 1" | head -1)
            [ -n "$pid" ] && kill -KILL "$pid" && killed=1
        fi
    fi
    sleep 0.1
done
wait "$job_pid"
rc=$?
[ "$rc" -eq 0 ] || fail "psd.sbatch exited with status $rc"
[ "$killed" -eq 1 ] || fail "shard 1 was never seen past step 50 on its /metrics"
grep -q "psd-shard: shard 1 exited with status 137; starting it again" "$tmp/out" ||
    fail "psd-shard.sh did not start shard 1 again"
grep -q "pslaunch: the job is complete" "$tmp/out" || fail "pslaunch never said the job is complete"
# The shards stopped cleanly, each committing (not killed by srun: "forcing job termination").
[ "$(grep -c "stopping at step" "$tmp/out")" -ge 2 ] ||
    fail "the shards did not stop cleanly: $(grep -E "forcing|Killed|stopping" "$tmp/out" | head -5)"
grep -q "^  - {host: 127.0.0.1, port: $((port + 1)), data_dir: $tmp/data/shard-1, metrics_port: $((mport + 1)), metrics_host: 0.0.0.0}$" \
    "$tmp/run/manifest.yaml" || fail "unexpected manifest: $(cat "$tmp/run/manifest.yaml")"
pgrep -f "$tmp/" > /dev/null && fail "processes left running: $(pgrep -af "$tmp/")"

# SIGTERM to psd.sbatch mid-run (scancel): it stops the workers and the shards and exits 143,
# leaving nothing running.
sed -e 's/max_steps: 600/max_steps: 1000000/' -e "s/slurm-verify-$$/slurm-verify-$$-b/" \
    "$tmp/job.yaml" > "$tmp/long.yaml"
PSD_DATA=$tmp/data-long PSD_RUN_DIR=$tmp/run-long \
    "$root/deploy/slurm/psd.sbatch" "$tmp/long.yaml" > "$tmp/out-long" 2>&1 &
job_pid=$!
for _ in $(seq 300); do
    step=$(shard_step "$mport")
    [ -n "$step" ] && [ "$step" -ge 20 ] && break
    sleep 0.1
done
[ -n "$step" ] && [ "$step" -ge 20 ] || fail "the long job never reached step 20"
kill -TERM "$job_pid"
for _ in $(seq 300); do kill -0 "$job_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$job_pid" 2>/dev/null && fail "psd.sbatch still runs 30 s after SIGTERM"
wait "$job_pid"
rc=$?
[ "$rc" -eq 143 ] || fail "psd.sbatch exited with $rc after SIGTERM, want 143: $(tail -5 "$tmp/out-long")"
for _ in $(seq 100); do pgrep -f "$tmp/" > /dev/null || break; sleep 0.1; done
pgrep -f "$tmp/" > /dev/null && fail "processes left after SIGTERM: $(pgrep -af "$tmp/")"
[ "$(grep -c "stopping at step" "$tmp/out-long")" -ge 2 ] ||
    fail "the shards did not stop cleanly after SIGTERM: $(grep -E "forcing|Killed|stopping" "$tmp/out-long" | head -5)"

# A shard psd-shard.sh gives up on (PSD_RESTARTS=0: at its first death): psd.sbatch stops the
# workers and the other shard and exits 1, rather than waiting for pslaunch until the time
# limit while the workers wait for the shard.
sed -e "s/slurm-verify-$$-b/slurm-verify-$$-c/" "$tmp/long.yaml" > "$tmp/gone.yaml"
PSD_DATA=$tmp/data-gone PSD_RUN_DIR=$tmp/run-gone PSD_RESTARTS=0 \
    "$root/deploy/slurm/psd.sbatch" "$tmp/gone.yaml" > "$tmp/out-gone" 2>&1 &
job_pid=$!
for _ in $(seq 300); do
    step=$(shard_step $((mport + 1)))
    [ -n "$step" ] && [ "$step" -ge 20 ] && break
    sleep 0.1
done
[ -n "$step" ] && [ "$step" -ge 20 ] || fail "the third job never reached step 20"
pid=$(pgrep -f "$tmp/run-gone/manifest.yaml --shard 1" | head -1)
[ -n "$pid" ] && kill -KILL "$pid"
for _ in $(seq 300); do kill -0 "$job_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$job_pid" 2>/dev/null && fail "psd.sbatch still runs 30 s after its shard 1 was given up"
wait "$job_pid"
rc=$?
[ "$rc" -eq 1 ] && grep -q "psd.sbatch: shard-1 is down for good (status 137)" "$tmp/out-gone" ||
    fail "a shard given up gave status $rc: $(tail -5 "$tmp/out-gone")"
for _ in $(seq 100); do pgrep -f "$tmp/" > /dev/null || break; sleep 0.1; done
pgrep -f "$tmp/" > /dev/null && fail "processes left after a shard was given up: $(pgrep -af "$tmp/")"

# A template with servers: is refused with exit 2 and a reason.
printf 'servers:\n  - {host: a, port: 1, data_dir: /d}\n' >> "$tmp/job.yaml"
"$root/deploy/slurm/psd.sbatch" "$tmp/job.yaml" > "$tmp/out2" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "has a servers: section" "$tmp/out2" ||
    fail "a template with servers: gave status $rc"
# A template psctl check refuses: exit 2 with its FILE:LINE message.
sed -e '/^servers:/,$d' -e 's/batch_size: 32/batch_size: lots/' "$tmp/job.yaml" > "$tmp/bad.yaml"
"$root/deploy/slurm/psd.sbatch" "$tmp/bad.yaml" > "$tmp/out3" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "manifest.yaml:[0-9]*: job.batch_size: " "$tmp/out3" ||
    fail "a bad template gave status $rc: $(cat "$tmp/out3")"
echo "verify.sh: psd.sbatch ran a 2-shard job to its end through a psd kill -9, stopped on a shard given up"
