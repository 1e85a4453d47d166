#!/usr/bin/env bash
# run.sh: fuzz what peers and files hand psd with libFuzzer (tests/fuzz/README.md).
#   tests/fuzz/run.sh [--time SECONDS] [TARGET...]
# Sets up and builds ./build-fuzz (clang, AddressSanitizer and UBSan, coverage for libFuzzer;
# FUZZ_BUILD names another directory), then runs each TARGET (default: all of wire bundle
# manifest codec json tcpguard httphead) for SECONDS (default 60) from the seeds fuzz_seeds
# writes (seeds.c) and what earlier runs kept in BUILD/corpus/TARGET, where it keeps what it
# finds. A failed property or a sanitizer's report leaves its input in BUILD/crashes/ and the
# run exits 1 (after the other targets ran): add that input to seeds.c's regressions with the
# fix.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
all=(wire bundle manifest codec json tcpguard httphead)
secs=60
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
    --time) [ $# -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --time needs a number of seconds" >&2; exit 2; }
        secs=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [[ " ${all[*]} " == *" $1 "* ]] || { echo "run.sh: no target '$1' (targets: ${all[*]})" >&2; exit 2; }
        targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

# clang, and its sanitizer and libFuzzer runtimes (only recommended by clang: not installed
# with --no-install-recommends).
missing=()
for p in clang libclang-rt-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "run.sh: installing ${missing[*]}"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "run.sh: install ${missing[*]} (apt-get, as root)" >&2; exit 1; }
        sudo="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cd "$root"
build=${FUZZ_BUILD:-build-fuzz}
if [ ! -f "$build/build.ninja" ]; then
    CC=clang meson setup "$build" --buildtype debugoptimized -Dcuda=disabled -Dtests=enabled -Dfuzz=true \
        -Db_sanitize=address,undefined -Db_lundef=false \
        -Dc_args='-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined' >/dev/null ||
        { echo "run.sh: meson setup of $build failed (deploy/local/setup.sh installs what psd needs; see $build/meson-logs)" >&2; exit 1; }
fi
programs=(tests/fuzz/fuzz_seeds $(printf 'tests/fuzz/fuzz_%s ' "${targets[@]}"))
ninja -C "$build" "${programs[@]}" >/dev/null || { ninja -C "$build" "${programs[@]}"; exit 1; }
"$build/tests/fuzz/fuzz_seeds" "$build/seeds"
mkdir -p "$build/crashes"

export PS_LOG_LEVEL=${PS_LOG_LEVEL:-error} # the refusals the harnesses provoke, not logged
failed=()
for t in "${targets[@]}"; do
    work="$build/corpus/$t"
    mkdir -p "$work"
    [ -d "$build/seeds/$t" ] && cp -n "$build/seeds/$t"/* "$work"/ 2>/dev/null || true
    [ "$t" = manifest ] && cp -n deploy/local/demo.yaml "$work"/ 2>/dev/null || true
    log="$build/fuzz_$t.log"
    echo "run.sh: fuzz_$t for ${secs} s (log: $log)"
    opts=(-max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$build/crashes/$t-")
    [ -f "tests/fuzz/$t.dict" ] && opts+=(-dict="tests/fuzz/$t.dict")
    [ "$t" = httphead ] && opts+=(-max_len=20000) # past the head's 8192 bytes
    if "$build/tests/fuzz/fuzz_$t" "${opts[@]}" "$work" >"$log" 2>&1; then
        echo "  $(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}') inputs," \
             "$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2) edges covered, no failure"
    else
        failed+=("$t")
        why=$(grep -E '^(fuzz_|==[0-9]+== ?ERROR|SUMMARY)' "$log" | head -2 | tr '\n' ' ' || true)
        echo "  FAILED: ${why:-$(tail -2 "$log" | tr '\n' ' ')}"
        grep -E 'Test unit written to' "$log" | sed 's/^/  /' || true
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "run.sh: failed: ${failed[*]} (replay an input: $build/tests/fuzz/fuzz_TARGET FILE)"
    exit 1
fi
echo "run.sh: ${targets[*]}: no failure in ${secs} s each"
