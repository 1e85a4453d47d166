#!/usr/bin/env bash
# psd-shard.sh PSD MANIFEST: one Slurm task of deploy/slurm/psd.sbatch's psd step. Runs shard
# $SLURM_PROCID of MANIFEST and starts it again when it dies (as systemd's Restart=on-failure
# does: psd resumes at its last committed step and its workers reconnect by themselves), but
# not after a clean exit or exit 2 (a manifest or argument psd refuses). SIGTERM / SIGINT go to
# psd, which finishes its steps in flight and exits 0. When it gives up on the shard (PSD_RESTARTS
# failures, or exit 2) it writes MANIFEST's directory/shard-N.gave-up, which psd.sbatch watches
# for: the job cannot go on without the shard, and its workers would wait for it for good.
set -uo pipefail
psd=${1:?usage: psd-shard.sh PSD MANIFEST}
manifest=${2:?usage: psd-shard.sh PSD MANIFEST}
shard=${SLURM_PROCID:?psd-shard.sh runs as a Slurm task (SLURM_PROCID is not set)}
restarts=${PSD_RESTARTS:-10}
child=0
stop=0
on_signal() {
    stop=1
    [ "$child" -gt 0 ] && kill -TERM "$child" 2>/dev/null
}
trap on_signal TERM INT
for ((n = 0; ; n++)); do
    "$psd" --manifest "$manifest" --shard "$shard" &
    child=$!
    [ "$stop" -eq 1 ] && kill -TERM "$child" 2>/dev/null # a signal before child was set
    # wait returns early when a trapped signal arrives: wait again for psd itself.
    while wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null; do :; done
    child=0
    if [ "$stop" -eq 1 ] || [ "$rc" -eq 0 ]; then exit "$rc"; fi
    if [ "$rc" -eq 2 ] || [ "$n" -ge "$restarts" ]; then
        [ "$rc" -ne 2 ] &&
            echo "psd-shard: shard $shard failed (status $rc) $((n + 1)) times; giving up" >&2
        echo "status $rc" 2>/dev/null > "$(dirname "$manifest")/shard-$shard.gave-up"
        exit "$rc"
    fi
    echo "psd-shard: shard $shard exited with status $rc; starting it again" >&2
    sleep 1
    [ "$stop" -eq 1 ] && exit 143 # stopped while it waited
done
