#!/usr/bin/env bash
# Fetch NVIDIA's real CUDA driver and NVML headers from PyPI (idempotent).
#
# The headers ship in two wheels: cuda.h / cudaTypedefs.h in nvidia-cuda-runtime-cu12 and
# nvml.h in nvidia-nvml-dev-cu12. They are unpacked into $CARGO_TARGET_DIR/nvidia-headers
# (default: target/nvidia-headers at the repository root) and the script prints the two
# include directories, one per line:
#
#     <dir>/nvidia/cuda_runtime/include
#     <dir>/nvidia/nvml_dev/include
#
# A second run finds them and downloads nothing. Exits non-zero with a message on stderr
# when they cannot be fetched (no network, no pip): callers must fail, not skip.
#
# Versions are pinned so that everything generated from these headers
# (crates/vgpu-abi/src/cuda_procs.rs) is reproducible.
set -euo pipefail

CUDA_WHEEL="nvidia-cuda-runtime-cu12==12.9.79"
NVML_WHEEL="nvidia-nvml-dev-cu12==12.9.79"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
dest="$target_dir/nvidia-headers"
cuda_inc="$dest/nvidia/cuda_runtime/include"
nvml_inc="$dest/nvidia/nvml_dev/include"

have_headers() {
    [[ -f "$cuda_inc/cuda.h" && -f "$cuda_inc/cudaTypedefs.h" && -f "$nvml_inc/nvml.h" ]]
}

print_dirs() {
    printf '%s\n%s\n' "$cuda_inc" "$nvml_inc"
}

if have_headers; then
    print_dirs
    exit 0
fi

mkdir -p "$target_dir"
# Tests run in parallel; one of them downloads, the others wait and then find the headers.
exec 9>"$target_dir/.nvidia-headers.lock"
flock 9
if have_headers; then
    print_dirs
    exit 0
fi

python=""
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -m pip --version >/dev/null 2>&1; then
        python="$candidate"
        break
    fi
done
if [[ -z "$python" ]]; then
    echo "fetch-headers: need python3 with pip to download $CUDA_WHEEL and $NVML_WHEEL" >&2
    exit 1
fi

work="$(mktemp -d "$target_dir/.nvidia-headers.XXXXXX")"
trap 'rm -rf "$work"' EXIT

if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux2014_x86_64 --python-version 3.11 \
        -d "$work/wheels" "$CUDA_WHEEL" "$NVML_WHEEL" >&2; then
    echo "fetch-headers: could not download $CUDA_WHEEL and $NVML_WHEEL from PyPI (network?)" >&2
    exit 1
fi

mkdir -p "$work/unpacked"
for wheel in "$work"/wheels/*.whl; do
    "$python" - "$wheel" "$work/unpacked" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    for name in zf.namelist():
        if "/include/" in name and name.startswith("nvidia/"):
            zf.extract(name, out)
EOF
done

if [[ ! -f "$work/unpacked/nvidia/cuda_runtime/include/cuda.h" || ! -f "$work/unpacked/nvidia/nvml_dev/include/nvml.h" ]]; then
    echo "fetch-headers: the wheels did not contain cuda.h and nvml.h where expected" >&2
    exit 1
fi

rm -rf "$dest"
mv "$work/unpacked" "$dest"
print_dirs
