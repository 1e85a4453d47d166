#!/usr/bin/env bash
# test.sh: install and build what is missing, then run the whole test suite
# (unit and integration). Ends with one line "N passed, N failed".
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
"$root/deploy/local/setup.sh" || exit 1
cd "$root"
# Two tests at a time, as on the 2-CPU machines the suites are checked on (the integration
# suites mostly wait: two side by side take about as long each as alone); MESON_TESTTHREADS
# or -j N changes it.
export MESON_TESTTHREADS=${MESON_TESTTHREADS:-2}
meson test -C build --print-errorlogs "$@"
rc=$?
# Count the individual test cases from the TAP streams in meson's log.
log=build/meson-logs/testlog.txt
passed=$(grep -cE '^ok [0-9]+' "$log" || true)
failed=$(grep -cE '^not ok [0-9]+' "$log" || true)
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # a suite that crashed or timed out
echo "$passed passed, $failed failed"
exit $rc
