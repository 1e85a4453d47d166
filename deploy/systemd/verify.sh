#!/usr/bin/env bash
# Check the units here with `systemd-analyze verify`, their binaries taken from a build
# directory instead of /usr/local/bin: any complaint fails. Exit 77 (skipped) without
# systemd-analyze. Usage: deploy/systemd/verify.sh [BUILD_DIR] (default build/).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd) || exit 1
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
user=$(id -un)
sed -e "s#/usr/local/bin/psd #$build/server/psd #" -e "s/^User=psd/User=$user/" \
    "$here/psd@.service" > "$tmp/psd@.service"
sed -e "s#/usr/local/bin/pslaunch #$build/worker/pslaunch #" -e "s/^User=psd/User=$user/" \
    "$here/pslaunch.service" > "$tmp/pslaunch.service"
cp "$tmp/psd@.service" "$tmp/psd@0.service"
out=$(cd "$tmp" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify ./psd@0.service \
      ./pslaunch.service 2>&1)
# Only what is said of these units counts: a host without a running systemd may add lines of
# its own (shown, not failed on).
ours=$(printf '%s\n' "$out" | grep -E 'psd@|pslaunch\.service' || true)
[ -n "$out" ] && printf '%s\n' "$out"
if [ -n "$ours" ]; then
    echo "systemd units: FAILED"
    exit 1
fi
echo "systemd units: psd@.service and pslaunch.service verify"
