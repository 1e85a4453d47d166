#!/bin/sh
# trace_merge.sh OUT TRACE...: one Chrome trace (chrome://tracing, ui.perfetto.dev) of several
# psd --trace and libps PS_TRACE files. The processes of one host share CLOCK_MONOTONIC, so
# their events line up: a step from the workers' ops to the shards' applies in one view.
# A trace whose process was killed may end in a half-written line: drop that line first.
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 OUT TRACE..." >&2
    exit 2
fi
out=$1
shift
for f in "$@"; do
    if [ "$(head -n 1 "$f")" != "[" ]; then
        echo "$0: $f is not a psd or libps trace (its first line is not '[')" >&2
        exit 1
    fi
done
{
    echo '['
    sep=''
    for f in "$@"; do
        [ -z "$sep" ] || echo "$sep"
        sep=','
        sed -e '1d' -e '/^\]$/d' "$f"
    done
    echo ']'
} >"$out"
