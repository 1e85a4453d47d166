#!/usr/bin/env bash
# setup.sh: install what psd needs from Debian 12's packages (only what is
# missing; silent and fast when everything is present), then configure and
# build into ./build. Idempotent: run it as often as you like.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

pkgs=(gcc pkg-config meson ninja-build libuv1-dev libucx-dev liblmdb-dev libprotobuf-c-dev
      protobuf-c-compiler check libopenblas-dev libyaml-dev libxxhash-dev zlib1g-dev
      dataset-fashion-mnist ucx-utils libssl-dev python3-torch)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cd "$root"
# The CUDA toolkit (nvcc, cuBLAS) is not a Debian package here: where NVIDIA's is installed
# under /usr/local/cuda, the build takes it (psworker --device cuda); elsewhere it builds
# without CUDA.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
fi
if [ ! -f build/build.ninja ]; then
    meson setup build >/dev/null || { echo "setup: meson setup failed (see build/meson-logs)"; exit 1; }
fi
ninja -C build >/dev/null || { ninja -C build; exit 1; }
