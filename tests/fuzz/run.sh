#!/usr/bin/env bash
# run.sh: fuzz what peers and files hand psd with libFuzzer (tests/fuzz/README.md).
#   tests/fuzz/run.sh [--time SECONDS] [--merge] [TARGET...]
# Sets up and builds ./build-fuzz (clang, AddressSanitizer and UBSan, coverage for libFuzzer;
# FUZZ_BUILD names another directory), then runs each TARGET (default: all of wire bundle
# manifest codec json tcpguard) for SECONDS (default 60) from tests/fuzz/corpus/TARGET and the
# seeds fuzz_seeds writes, keeping what it finds in BUILD/corpus/TARGET. A failed property or
# a sanitizer's report leaves its input in BUILD/crashes/ and the run exits 1 (after the other
# targets ran). --merge adds the inputs that reach new code to tests/fuzz/corpus/TARGET, the
# corpus the unit tests replay (commit them).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
all=(wire bundle manifest codec json tcpguard)
secs=60
merge=0
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
    --time) [ $# -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --time needs a number of seconds" >&2; exit 2; }
        secs=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [[ " ${all[*]} " == *" $1 "* ]] || { echo "run.sh: no target '$1' (targets: ${all[*]})" >&2; exit 2; }
        targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

if ! command -v clang >/dev/null 2>&1; then
    echo "run.sh: installing clang (libFuzzer comes with it)"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends clang >/dev/null
fi

cd "$root"
build=${FUZZ_BUILD:-build-fuzz}
if [ ! -f "$build/build.ninja" ]; then
    CC=clang meson setup "$build" --buildtype debugoptimized -Dcuda=disabled -Dfuzz=true \
        -Db_sanitize=address,undefined -Db_lundef=false \
        -Dc_args='-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined' >/dev/null ||
        { echo "run.sh: meson setup of $build failed (deploy/local/setup.sh installs what psd needs; see $build/meson-logs)" >&2; exit 1; }
fi
ninja -C "$build" tests/fuzz/fuzz_seeds $(printf 'tests/fuzz/fuzz_%s ' "${targets[@]}") >/dev/null ||
    { ninja -C "$build" tests/fuzz/fuzz_seeds; exit 1; }
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
    dict=()
    [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
    if "$build/tests/fuzz/fuzz_$t" -max_total_time="$secs" -print_final_stats=1 "${dict[@]}" \
        -artifact_prefix="$build/crashes/$t-" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
        echo "  $(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}') inputs," \
             "$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2) edges covered, no failure"
    else
        failed+=("$t")
        why=$(grep -E '^(fuzz_|==[0-9]+==ERROR|SUMMARY)' "$log" | head -2 | tr '\n' ' ')
        echo "  FAILED: ${why:-$(tail -2 "$log" | tr '\n' ' ')}"
        grep -E 'Test unit written to' "$log" | sed 's/^/  /' || true
    fi
    if [ "$merge" = 1 ]; then
        "$build/tests/fuzz/fuzz_$t" -merge=1 "tests/fuzz/corpus/$t" "$work" >/dev/null 2>&1
        echo "  tests/fuzz/corpus/$t: $(ls "tests/fuzz/corpus/$t" | wc -l) inputs"
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "run.sh: failed: ${failed[*]} (replay an input: $build/tests/fuzz/fuzz_TARGET FILE)"
    exit 1
fi
echo "run.sh: ${targets[*]}: no failure in ${secs} s each"
