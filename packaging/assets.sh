#!/usr/bin/env bash
# Generate what the .deb ships but the tree does not hold, into OUTDIR (default target/assets):
#   completions/vgpu.bash, completions/_vgpu, completions/vgpu.fish   `vgpu completions SHELL`
#   systemd/*.service, *.timer, *.slice   systemd/'s units, running /usr/bin/vgpu (the
#                                         package's path) instead of /usr/local/bin/vgpu
#
#   packaging/assets.sh VGPU_BINARY [OUTDIR]
#
# packaging/deb.sh runs it; tests/cli/install.rs checks its output against [package.metadata.deb].
set -euo pipefail

[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: packaging/assets.sh VGPU_BINARY [OUTDIR]" >&2; exit 2; }
vgpu=$1
here=$(cd "$(dirname "$0")/.." && pwd)
out=${2:-$here/target/assets}

rm -rf "$out/completions" "$out/systemd"
mkdir -p "$out/completions" "$out/systemd"
"$vgpu" completions bash > "$out/completions/vgpu.bash"
"$vgpu" completions zsh > "$out/completions/_vgpu"
"$vgpu" completions fish > "$out/completions/vgpu.fish"

for unit in "$here"/systemd/*.service "$here"/systemd/*.timer "$here"/systemd/*.slice; do
  [ -f "$unit" ] || continue
  sed -e 's|/usr/local/bin/vgpu|/usr/bin/vgpu|g' -e 's|/usr/local/lib/vgpu|/usr/lib/vgpu|g' \
    "$unit" > "$out/systemd/$(basename "$unit")"
done
chmod 0644 "$out"/completions/* "$out"/systemd/*
