#!/usr/bin/env bash
# Install the real third-party GPU clients of tests/cli/pyclients.rs from PyPI (idempotent).
#
# Unmodified programs that talk to NVML or the CUDA driver API directly, installed into a
# virtualenv at $CARGO_TARGET_DIR/pyclients (default: target/pyclients at the repository
# root). The script prints the virtualenv's directory; its bin/ holds the programs:
#
#     gpustat   (gpustat, NVML through nvidia-ml-py)      `gpustat --json`
#     nvitop    (nvitop, NVML through nvidia-ml-py)       `nvitop --once`
#     py3smi    (py3nvml, NVML through its own ctypes)    `py3smi`
#     python    with cuda.bindings.driver (cuda-bindings, the CUDA driver API)
#
# A second run finds them and installs nothing. Exits non-zero with a message on stderr
# when they cannot be installed (no network, no python3 venv/pip): callers must fail, not
# skip.
#
# Every package, dependencies included, is pinned to an exact version, so the clients the
# tests run are the same everywhere. nvidia-ml-py is the R570 one, the driver the fake
# simulates; cuda-bindings is CUDA 12's, the fake's CUDA version.
set -euo pipefail

PACKAGES=(
    "gpustat==1.1.1"
    "nvitop==1.7.2"
    "py3nvml==0.2.7"
    "cuda-bindings==12.9.4"
    # Their dependencies.
    "nvidia-ml-py==12.570.172"
    "psutil==7.2.2"
    "blessed==1.52.0"
    "wcwidth==0.9.4"
    "jinxed==2.1.0"
    "xmltodict==1.0.4"
    "cuda-pathfinder==1.9.0"
)

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
dest="$target_dir/pyclients"
# What an installed virtualenv records: a change to the pins reinstalls.
stamp_text="$(printf '%s\n' "${PACKAGES[@]}")"

installed() {
    [[ -f "$dest/.installed" && "$(cat "$dest/.installed")" == "$stamp_text" ]] &&
        [[ -x "$dest/bin/gpustat" && -x "$dest/bin/nvitop" && -x "$dest/bin/py3smi" && -x "$dest/bin/python" ]]
}

if installed; then
    echo "$dest"
    exit 0
fi

mkdir -p "$target_dir"
# Tests run in parallel; one of them installs, the others wait and then find the clients.
exec 9>"$target_dir/.pyclients.lock"
flock 9
if installed; then
    echo "$dest"
    exit 0
fi

python=""
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        python="$candidate"
        break
    fi
done
if [[ -z "$python" ]]; then
    echo "fetch-pyclients: need python3 with the venv module and ensurepip (Debian: apt-get install python3-venv)" >&2
    exit 1
fi

work="$(mktemp -d "$target_dir/.pyclients.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Built where it will live: a virtualenv's scripts name their interpreter by absolute path.
rm -rf "$dest"
if ! "$python" -m venv "$dest" >&2; then
    echo "fetch-pyclients: $python -m venv $dest failed" >&2
    rm -rf "$dest"
    exit 1
fi
if ! "$dest/bin/python" -m pip install --quiet --no-input --disable-pip-version-check \
        "${PACKAGES[@]}" >&2; then
    echo "fetch-pyclients: could not install ${PACKAGES[*]} from PyPI (network?)" >&2
    rm -rf "$dest"
    exit 1
fi
printf '%s\n' "$stamp_text" > "$work/installed"
mv "$work/installed" "$dest/.installed"
echo "$dest"
