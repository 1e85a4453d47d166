#!/bin/sh
# trace_merge.sh OUT TRACE...: one Chrome trace (chrome://tracing, ui.perfetto.dev) of several
# psd --trace and libps PS_TRACE files. The processes of one host share CLOCK_MONOTONIC, so
# their events line up: a step from the workers' ops to the shards' applies in one view. A
# trace whose process was killed (no closing "]") is taken up to its last whole event.
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 OUT TRACE..." >&2
    exit 2
fi
out=$1
shift
for f in "$@"; do
    if [ -e "$out" ] && [ "$f" -ef "$out" ]; then
        echo "$0: $f is both an input and the output" >&2
        exit 2
    fi
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
        # Its events without the brackets; the last one loses a comma a killed writer left,
        # and a half-written last line is dropped.
        sed -e '1d' -e '/^\]$/d' "$f" | sed -e '${/},\{0,1\}$/!d;}' | sed -e '$s/,$//'
    done
    echo ']'
} >"$out"
