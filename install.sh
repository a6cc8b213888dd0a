#!/usr/bin/env bash
# Build vgpu from source and install it.
#
#   ./install.sh                     build and install under /usr/local (run as root)
#   ./install.sh --prefix /opt/vgpu  another prefix
#   ./install.sh --no-watch          do not enable or start vgpu-watch.service (or VGPU_NO_WATCH=1)
#   ./install.sh --uninstall         remove what install.sh installed (keeps /etc/vgpu)
#
# Installs: PREFIX/bin/vgpu, PREFIX/lib/vgpu/{libvgpu.so,libfakegpu.so} (the shim and the
# simulated driver used by --simulate), PREFIX/share/man/man1/vgpu.1, shell completions,
# systemd units in $SYSTEMD_DIR (default /etc/systemd/system), and a commented default
# config /etc/vgpu/config.toml that is never overwritten once it exists (a newer default
# goes to config.toml.default beside it). Where systemd runs, it enables vgpu-watch.service
# and (re)starts it on the new binary. Safe to run again.
set -euo pipefail

prefix=/usr/local
uninstall=0
etc_dir=${VGPU_ETC_DIR:-/etc/vgpu}
systemd_dir=${SYSTEMD_DIR:-/etc/systemd/system}

case "${VGPU_NO_WATCH:-}" in ''|0) no_watch=0 ;; *) no_watch=1 ;; esac

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --uninstall) uninstall=1; shift ;;
    --no-watch) no_watch=1; shift ;;
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
units=(vgpu-carbon.service vgpu-carbon.timer vgpu-watch.service)
watch_unit=vgpu-watch.service

# Whether systemd runs here (sd_booted: /run/systemd/system) and loads units from
# $systemd_dir: only then does install.sh ask it to (re)load, enable, start or stop a unit.
systemd_manages_units() {
  [ -d /run/systemd/system ] && command -v systemctl >/dev/null || return 1
  case "$systemd_dir" in
    /etc/systemd/system|/lib/systemd/system|/usr/lib/systemd/system) return 0 ;;
    *) return 1 ;;
  esac
}

if [ "$uninstall" = 1 ]; then
  rm -f "$bin" "$libdir/libvgpu.so" "$libdir/libfakegpu.so" "$man" "$bash_completion"
  rmdir "$libdir" 2>/dev/null || true
  for unit in "${units[@]}"; do
    if [ -f "$systemd_dir/$unit" ]; then
      if systemd_manages_units; then systemctl disable --now "$unit" >/dev/null 2>&1 || true; fi
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
    chmod 0644 "$systemd_dir/$unit.tmp"
    mv "$systemd_dir/$unit.tmp" "$systemd_dir/$unit"
  done
  if systemd_manages_units; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
fi

install -d "$etc_dir"
if [ ! -e "$etc_dir/config.toml" ]; then
  install -m 0644 "$here/examples/config.toml" "$etc_dir/config.toml"
elif ! cmp -s "$here/examples/config.toml" "$etc_dir/config.toml"; then
  install -m 0644 "$here/examples/config.toml" "$etc_dir/config.toml.default"
  echo "kept your $etc_dir/config.toml; the new default is $etc_dir/config.toml.default"
fi

echo "installed vgpu $("$bin" --version | cut -d' ' -f2) to $prefix (shim: $libdir/libvgpu.so)"

# The enforcer, where systemd is the service manager: enabled, and (re)started so that it runs
# the binary just installed.
if [ -f "$systemd_dir/$watch_unit" ]; then
  if [ "$no_watch" = 1 ]; then
    echo "$watch_unit installed, not enabled (--no-watch / VGPU_NO_WATCH=1): systemctl enable --now $watch_unit starts it"
  elif [ ! -d /run/systemd/system ] || ! command -v systemctl >/dev/null; then
    echo "$watch_unit installed, not started: systemd is not running here (run 'vgpu watch' under your service manager)"
  elif ! systemd_manages_units; then
    echo "$watch_unit installed in $systemd_dir, not started: systemd does not load units from there"
  elif systemctl enable --quiet "$watch_unit" && systemctl restart "$watch_unit"; then
    echo "vgpu watch enabled and started: systemctl status $watch_unit; journalctl -u $watch_unit (opt out: ./install.sh --no-watch)"
  else
    echo "install.sh: vgpu is installed, but $watch_unit did not start: see systemctl status $watch_unit" >&2
  fi
fi
