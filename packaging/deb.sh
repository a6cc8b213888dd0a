#!/usr/bin/env bash
# Build the Debian package, target/debian/vgpu_<version>-1_<arch>.deb, for
# `apt install ./target/debian/vgpu_*.deb`:
#
#   packaging/deb.sh [cargo-deb options]
#
# Needs cargo-deb (`cargo install cargo-deb --locked`) and dpkg-dev (dpkg-shlibdeps works out
# the package's dependencies). Builds the release artefacts for the prefix /usr (VGPU_PREFIX:
# where the binary looks for libvgpu.so last), generates what the package ships but the tree
# does not hold into target/assets (packaging/assets.sh), then packs [package.metadata.deb]
# of Cargo.toml without building again.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-deb >/dev/null || {
  echo "packaging/deb.sh: cargo-deb not found: cargo install cargo-deb --locked" >&2
  exit 1
}
VGPU_PREFIX=/usr cargo build --release --workspace --exclude workspace-hack --locked
release="${CARGO_TARGET_DIR:-target}/release"
packaging/assets.sh "$release/vgpu" target/assets
# --no-strip: the release profile already drops debug info; symbol names stay for backtraces.
cargo deb --no-build --no-strip --package vgpu "$@"
