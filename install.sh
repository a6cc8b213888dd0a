#!/usr/bin/env bash
# Build vgpu from source and install it.
#
#   ./install.sh                     build and install under /usr/local (run as root)
#   ./install.sh --prefix /opt/vgpu  another prefix
#   ./install.sh --uninstall         remove what install.sh installed (keeps /etc/vgpu)
#
# Installs: PREFIX/bin/vgpu, PREFIX/lib/vgpu/{libvgpu.so,libfakegpu.so} (the shim and the
# simulated driver used by --simulate), PREFIX/share/man/man1/vgpu.1, shell completions,
# systemd units in $SYSTEMD_DIR (default /etc/systemd/system), and a commented default
# config /etc/vgpu/config.toml that is never overwritten once it exists (a newer default
# goes to config.toml.default beside it). Safe to run again.
set -euo pipefail

prefix=/usr/local
uninstall=0
etc_dir=${VGPU_ETC_DIR:-/etc/vgpu}
systemd_dir=${SYSTEMD_DIR:-/etc/systemd/system}

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in /*) ;; *) prefix="$(pwd)/$prefix" ;; esac

here=$(cd "$(dirname "$0")" && pwd)
bin="$prefix/bin/vgpu"
libdir="$prefix/lib/vgpu"
man="$prefix/share/man/man1/vgpu.1"
bash_completion="$prefix/share/bash-completion/completions/vgpu"
units=(vgpu-carbon.service vgpu-carbon.timer)

if [ "$uninstall" = 1 ]; then
  rm -f "$bin" "$libdir/libvgpu.so" "$libdir/libfakegpu.so" "$man" "$bash_completion"
  rmdir "$libdir" 2>/dev/null || true
  for unit in "${units[@]}"; do
    if [ -f "$systemd_dir/$unit" ]; then
      command -v systemctl >/dev/null && systemctl disable --now "$unit" >/dev/null 2>&1 || true
      rm -f "$systemd_dir/$unit"
    fi
  done
  echo "vgpu uninstalled from $prefix (config in $etc_dir kept)"
  exit 0
fi

command -v cargo >/dev/null || { echo "install.sh: cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }
echo "building vgpu (release)…"
(cd "$here" && VGPU_PREFIX="$prefix" cargo build --release --workspace --locked)

target="${CARGO_TARGET_DIR:-$here/target}/release"
install -d "$prefix/bin" "$libdir" "$(dirname "$man")" "$(dirname "$bash_completion")"
install -m 0755 "$target/vgpu" "$bin"
install -m 0755 "$target/libvgpu.so" "$libdir/libvgpu.so"
install -m 0755 "$target/libfakegpu.so" "$libdir/libfakegpu.so"
install -m 0644 "$here/man/vgpu.1" "$man"
"$bin" completions bash > "$bash_completion"

if [ -d "$(dirname "$systemd_dir")" ]; then
  install -d "$systemd_dir"
  for unit in "${units[@]}"; do
    [ -f "$here/systemd/$unit" ] || continue
    sed "s|/usr/local/bin/vgpu|$bin|g" "$here/systemd/$unit" > "$systemd_dir/$unit.tmp"
    mv "$systemd_dir/$unit.tmp" "$systemd_dir/$unit"
  done
  command -v systemctl >/dev/null && systemctl daemon-reload >/dev/null 2>&1 || true
fi

install -d "$etc_dir"
if [ ! -e "$etc_dir/config.toml" ]; then
  install -m 0644 "$here/examples/config.toml" "$etc_dir/config.toml"
elif ! cmp -s "$here/examples/config.toml" "$etc_dir/config.toml"; then
  install -m 0644 "$here/examples/config.toml" "$etc_dir/config.toml.default"
  echo "kept your $etc_dir/config.toml; the new default is $etc_dir/config.toml.default"
fi

echo "installed vgpu $("$bin" --version | cut -d' ' -f2) to $prefix (shim: $libdir/libvgpu.so)"
