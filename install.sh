#!/usr/bin/env bash
# Build vgpu from source and install it.
#
#   ./install.sh                     build (release) and install under /usr/local (as root)
#   ./install.sh --prefix DIR        install under DIR only: nothing outside DIR is touched
#   ./install.sh --systemd-dir DIR   put the systemd units in DIR (or SYSTEMD_DIR=DIR)
#   ./install.sh --etc-dir DIR       put the default config in DIR (or VGPU_ETC_DIR=DIR)
#   ./install.sh --no-build          install what is already built (target/release)
#   ./install.sh --no-watch          do not enable or start vgpu-watch.service (or VGPU_NO_WATCH=1)
#   ./install.sh --uninstall [--prefix DIR]   remove what install.sh installed there
#
# Installs PREFIX/bin/vgpu; PREFIX/lib/vgpu/{libvgpu.so,libfakegpu.so} (the shim and the
# simulated driver used by --simulate); every man page in PREFIX/share/man/man1; completions
# for bash, zsh and fish under PREFIX/share; the systemd units; and a commented default
# config, config.toml, never overwritten once edited (a newer default then goes to
# config.toml.default beside it).
#
# Where the units and the config go: for the default prefix /usr/local, in
# /etc/systemd/system and /etc/vgpu (where systemd and vgpu look); for any other prefix,
# in PREFIX/lib/systemd/system and PREFIX/etc/vgpu, so that nothing outside PREFIX is
# touched (`systemctl link` such a unit; `vgpu --config` reads such a config).
# --systemd-dir and --etc-dir choose either place. Where systemd runs and loads the units
# from where they went, vgpu-watch.service is enabled and (re)started on the new binary.
#
# Every file and directory it creates is listed in PREFIX/lib/vgpu/install-manifest.txt.
# --uninstall stops and disables the units listed there (and the instances of a template
# such as vgpu@.service), removes the files listed (a file
# changed since, such as an edited config, is kept and named), the simulated driver's
# links into PREFIX under the state directory, then the directories it created if empty.
# Safe to run again.
#
# Environment: VGPU_INSTALL_FROM=DIR takes the built files from DIR with --no-build
# (default: target/release, or $CARGO_TARGET_DIR/release). VGPU_INSTALL_ROOT=DIR, for
# tests, puts DIR in front of every path outside PREFIX (/etc, /run) and never runs
# systemctl.
set -euo pipefail

default_prefix=/usr/local
prefix=$default_prefix
uninstall=0
build=1
etc_dir=${VGPU_ETC_DIR:-}
systemd_dir=${SYSTEMD_DIR:-}
root=${VGPU_INSTALL_ROOT:-}
root=${root%/}
args=("$@")

case "${VGPU_NO_WATCH:-}" in ''|0) no_watch=0 ;; *) no_watch=1 ;; esac

# The comment block at the top of this file, up to its first line of code.
usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; }
die() { echo "install.sh: $*" >&2; exit 1; }
need_arg() { [ "$2" -ge 2 ] || { echo "install.sh: $1 needs a directory" >&2; exit 2; }; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) need_arg "$1" $#; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --systemd-dir) need_arg "$1" $#; systemd_dir=$2; shift 2 ;;
    --systemd-dir=*) systemd_dir=${1#--systemd-dir=}; shift ;;
    --etc-dir) need_arg "$1" $#; etc_dir=$2; shift 2 ;;
    --etc-dir=*) etc_dir=${1#--etc-dir=}; shift ;;
    --no-build) build=0; shift ;;
    --uninstall) uninstall=1; shift ;;
    --no-watch) no_watch=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

absolute() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$(pwd)/$1" ;; esac; }
[ -n "$prefix" ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }
prefix=$(absolute "$prefix")
prefix=${prefix%/}
[ -n "$prefix" ] || prefix=/

here=$(cd "$(dirname "$0")" && pwd)
bin="$prefix/bin/vgpu"
libdir="$prefix/lib/vgpu"
mandir="$prefix/share/man/man1"
manifest="$libdir/install-manifest.txt"
watch_unit=vgpu-watch.service

# System paths only for the default prefix; any other prefix keeps everything inside it.
if [ "$prefix" = "$default_prefix" ]; then
  : "${systemd_dir:=$root/etc/systemd/system}"
  : "${etc_dir:=$root/etc/vgpu}"
else
  : "${systemd_dir:=$prefix/lib/systemd/system}"
  : "${etc_dir:=$prefix/etc/vgpu}"
fi
systemd_dir=$(absolute "$systemd_dir")
etc_dir=$(absolute "$etc_dir")
# The manifest holds one TAB-separated entry a line: a path with a tab or a newline would
# split into entries of its own at --uninstall. Spaces are fine.
for dir in "$prefix" "$systemd_dir" "$etc_dir" "$root"; do
  case "$dir" in
    *$'\t'*|*$'\n'*) echo "install.sh: ${dir@Q} contains a tab or a newline, which the install manifest cannot hold" >&2; exit 2 ;;
  esac
done

# Whether systemd runs here (sd_booted: /run/systemd/system) and loads units from
# $systemd_dir: only then does install.sh ask it to (re)load, enable, start or stop a unit.
systemd_manages() {
  [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null || return 1
  case "${1%/}" in
    /etc/systemd/system|/lib/systemd/system|/usr/lib/systemd/system|/usr/local/lib/systemd/system) return 0 ;;
    *) return 1 ;;
  esac
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------------------------------
# The manifest: one entry a line, KIND<TAB>SHA256 (or -)<TAB>PATH, where KIND is
#   dir     a directory install.sh created (removed on uninstall if empty)
#   found   a directory that was there before (never removed)
#   file    a file it installed, with its content's hash when installed
#   unit    a systemd unit it installed (stopped and disabled before removal)
#   config  the default config it installed where none was

declare -A m_kind=() m_sha=()
m_order=()

m_put() { # KIND SHA PATH
  if [ -z "${m_kind[$3]+x}" ]; then m_order+=("$3"); fi
  # A directory once created by install.sh stays its own when a later run finds it.
  if [ "$1" = found ] && [ "${m_kind[$3]:-}" = dir ]; then return; fi
  m_kind[$3]=$1
  m_sha[$3]=$2
}

m_read() {
  [ -f "$manifest" ] || return 1
  local kind hash path
  while IFS=$'\t' read -r kind hash path; do
    case "$kind" in dir|found|file|unit|config) m_put "$kind" "$hash" "$path" ;; esac
  done < "$manifest"
}

m_write() {
  local tmp="$manifest.tmp.$$" path
  {
    echo "# vgpu install manifest, written by install.sh and read by install.sh --uninstall."
    echo "# prefix $prefix"
    echo "# KIND<TAB>SHA256<TAB>PATH: dir = created here, found = was there, file/unit/config = installed."
    for path in "${m_order[@]}"; do
      printf '%s\t%s\t%s\n' "${m_kind[$path]}" "${m_sha[$path]}" "$path"
    done
  } > "$tmp"
  chmod 0644 "$tmp"
  mv -f "$tmp" "$manifest"
}

# mkdir -p that records which directories it created and which it found.
make_dir() {
  local dir=$1 missing=() i
  while [ ! -d "$dir" ]; do
    missing+=("$dir")
    dir=$(dirname "$dir")
  done
  m_put found - "$dir"
  for ((i = ${#missing[@]} - 1; i >= 0; i--)); do
    install -d -m 0755 "${missing[i]}"
    m_put dir - "${missing[i]}"
  done
}

# install FILE as DEST (mode MODE) and record it as KIND.
put_file() { # KIND MODE SRC DEST
  make_dir "$(dirname "$4")"
  install -m "$2" "$3" "$4.tmp.$$"
  mv -f "$4.tmp.$$" "$4"
  m_put "$1" "$(sha "$4")" "$4"
}

# The simulated driver's links (`vgpu --simulate` makes <state-dir>/simulate/) that point
# into PREFIX: in the default state directory, VGPU_STATE_DIR's and the config's state_dir.
remove_simulate_links() {
  local dirs=("$root/run/vgpu") dir link target config
  [ -n "${VGPU_STATE_DIR:-}" ] && dirs+=("$root$VGPU_STATE_DIR")
  for config in "$etc_dir/config.toml" "$root/etc/vgpu/config.toml"; do
    [ -f "$config" ] || continue
    dir=$(sed -n 's/^[[:space:]]*state_dir[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$config" | tail -n 1)
    [ -n "$dir" ] && dirs+=("$root$dir")
  done
  for dir in "${dirs[@]}"; do
    dir="$dir/simulate"
    [ -d "$dir" ] && [ ! -L "$dir" ] || continue
    for link in "$dir"/* "$dir"/.[!.]*; do
      [ -L "$link" ] || continue
      target=$(readlink "$link")
      case "$target" in
        "$prefix"/*) rm -f "$link"; echo "removed $link (-> $target)" ;;
      esac
    done
    rmdir "$dir" 2>/dev/null || true
  done
}

# ---------------------------------------------------------------------------------------
if [ "$uninstall" = 1 ]; then
  if ! m_read; then
    # Installed by an install.sh older than the manifest: remove the files it installed
    # under PREFIX, and units only where they run this prefix's binary.
    echo "install.sh: no $manifest (installed by an older install.sh): removing its files, keeping directories" >&2
    legacy_units=${SYSTEMD_DIR:-$root/etc/systemd/system}
    for unit in "$legacy_units"/vgpu-*.service "$legacy_units"/vgpu-*.timer; do
      [ -f "$unit" ] && grep -q "^ExecStart=$bin " "$unit" 2>/dev/null || continue
      if systemd_manages "$legacy_units"; then systemctl disable --now "$(basename "$unit")" >/dev/null 2>&1 || true; fi
      rm -f "$unit"
    done
    rm -f "$bin" "$libdir/libvgpu.so" "$libdir/libfakegpu.so" "$mandir/vgpu.1" \
      "$prefix/share/bash-completion/completions/vgpu"
    remove_simulate_links
    rmdir "$libdir" 2>/dev/null || true
    echo "vgpu uninstalled from $prefix"
    exit 0
  fi

  kept=()
  reload=0
  # Units first: stopped and disabled while their binary is still there.
  for path in "${m_order[@]}"; do
    [ "${m_kind[$path]}" = unit ] && [ -f "$path" ] || continue
    if [ "$(sha "$path")" != "${m_sha[$path]}" ]; then
      kept+=("$path (changed since install.sh installed it)")
      continue
    fi
    if systemd_manages "$(dirname "$path")"; then
      unit=$(basename "$path")
      case "$unit" in
        *@.*)
          # A template (vgpu@.service): `systemctl disable --now vgpu@.service` stops none
          # of its instances (vgpu@llm.service), which ran on without their binary (seen
          # under a real systemd: tests/systemd/uninstall.rs); they are stopped and disabled
          # by name first.
          mapfile -t instances < <(systemctl list-units --all --plain --no-legend "${unit%%@*}@*.${unit##*.}" 2>/dev/null | awk '{print $1}')
          if [ ${#instances[@]} -gt 0 ]; then systemctl disable --now "${instances[@]}" >/dev/null 2>&1 || true; fi
          ;;
      esac
      systemctl disable --now "$unit" >/dev/null 2>&1 || true
      reload=1
    fi
    rm -f "$path"
  done
  for path in "${m_order[@]}"; do
    case "${m_kind[$path]}" in file|config) ;; *) continue ;; esac
    [ -e "$path" ] || [ -L "$path" ] || continue
    if [ -f "$path" ] && [ ! -L "$path" ] && [ "$(sha "$path")" = "${m_sha[$path]}" ]; then
      rm -f "$path"
    else
      kept+=("$path (changed since install.sh installed it)")
    fi
  done
  remove_simulate_links
  rm -f "$manifest"
  # Directories it created, deepest first, where empty now.
  mapfile -t dirs < <(for path in "${m_order[@]}"; do
    [ "${m_kind[$path]}" = dir ] && printf '%s\t%s\n' "$(tr -dc / <<<"$path" | wc -c)" "$path"
  done | sort -t$'\t' -k1,1nr | cut -f2-)
  for dir in "${dirs[@]}"; do
    [ -d "$dir" ] || continue
    rmdir "$dir" 2>/dev/null || kept+=("$dir/ (not empty)")
  done
  if [ "$reload" = 1 ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
  for path in "${kept[@]}"; do echo "kept $path"; done
  echo "vgpu uninstalled from $prefix"
  exit 0
fi

# ---------------------------------------------------------------------------------------
if [ "$build" = 1 ]; then
  if ! command -v cargo >/dev/null; then
    # The same options again, after --no-build.
    again_text=""
    for arg in "${args[@]}"; do again_text+=" $(printf '%q' "$arg")"; done
    env_text=""
    [ "$prefix" = "$default_prefix" ] || env_text="VGPU_PREFIX=$(printf '%q' "$prefix") "
    user_cargo=""
    if [ -n "${SUDO_USER:-}" ]; then
      user_home=$(getent passwd "$SUDO_USER" | cut -d: -f6 || true)
      if [ -n "$user_home" ] && [ -x "$user_home/.cargo/bin/cargo" ]; then user_cargo="$user_home/.cargo/bin/cargo"; fi
    fi
    {
      if [ -n "$user_cargo" ]; then
        echo "install.sh: cargo is not on root's PATH under sudo (sudo resets PATH), but $SUDO_USER has $user_cargo."
      elif [ -n "${SUDO_USER:-}" ]; then
        echo "install.sh: cargo is not on root's PATH under sudo (sudo resets PATH)."
      else
        echo "install.sh: cargo not found: install Rust (https://rustup.rs) first."
      fi
      if [ -n "${SUDO_USER:-}" ]; then
        echo "Build as yourself (${SUDO_USER}), then install what you built:"
        echo "  cd $(printf '%q' "$here") && ${env_text}cargo build --release --workspace --exclude workspace-hack --locked"
        echo "  sudo ./install.sh --no-build${again_text}"
      else
        echo "Or build where cargo is, then install the result with: ./install.sh --no-build${again_text}"
      fi
    } >&2
    exit 1
  fi
  echo "building vgpu (release)…"
  (cd "$here" && VGPU_PREFIX="$prefix" cargo build --release --workspace --exclude workspace-hack --locked)
  from="${CARGO_TARGET_DIR:-$here/target}/release"
else
  from=${VGPU_INSTALL_FROM:-${CARGO_TARGET_DIR:-$here/target}/release}
fi
from=$(absolute "$from")
for file in vgpu libvgpu.so libfakegpu.so; do
  [ -f "$from/$file" ] || die "$from/$file not found: build first (cargo build --release --workspace), or set VGPU_INSTALL_FROM"
done

m_read || true
make_dir "$libdir"
put_file file 0755 "$from/vgpu" "$bin"
put_file file 0755 "$from/libvgpu.so" "$libdir/libvgpu.so"
put_file file 0755 "$from/libfakegpu.so" "$libdir/libfakegpu.so"
for page in "$here"/man/*.1; do
  [ -f "$page" ] && put_file file 0644 "$page" "$mandir/$(basename "$page")"
done

tmpdir=$(mktemp -d)
trap 'rm -rf "$tmpdir"' EXIT
for shell in bash zsh fish; do
  case "$shell" in
    bash) dest="$prefix/share/bash-completion/completions/vgpu" ;;
    zsh) dest="$prefix/share/zsh/site-functions/_vgpu" ;;
    fish) dest="$prefix/share/fish/vendor_completions.d/vgpu.fish" ;;
  esac
  "$bin" completions "$shell" > "$tmpdir/completion" || die "$bin completions $shell failed"
  put_file file 0644 "$tmpdir/completion" "$dest"
done

units=()
for unit in "$here"/systemd/*.service "$here"/systemd/*.timer "$here"/systemd/*.slice; do
  [ -f "$unit" ] || continue
  name=$(basename "$unit")
  sed -e "s|/usr/local/bin/vgpu|$bin|g" -e "s|/usr/local/lib/vgpu|$libdir|g" "$unit" > "$tmpdir/$name"
  put_file unit 0644 "$tmpdir/$name" "$systemd_dir/$name"
  units+=("$name")
done
if [ ${#units[@]} -gt 0 ] && systemd_manages "$systemd_dir"; then systemctl daemon-reload >/dev/null 2>&1 || true; fi

config="$etc_dir/config.toml"
if [ ! -e "$config" ]; then
  put_file config 0644 "$here/examples/config.toml" "$config"
elif [ "${m_kind[$config]:-}" = config ] && [ -f "$config" ] && [ "$(sha "$config")" = "${m_sha[$config]}" ]; then
  # The default an earlier run installed, unedited: the new default replaces it.
  put_file config 0644 "$here/examples/config.toml" "$config"
elif ! cmp -s "$here/examples/config.toml" "$etc_dir/config.toml"; then
  put_file file 0644 "$here/examples/config.toml" "$etc_dir/config.toml.default"
  echo "kept your $etc_dir/config.toml; the new default is $etc_dir/config.toml.default"
fi
m_write

echo "installed vgpu $("$bin" --version | cut -d' ' -f2) to $prefix (shim: $libdir/libvgpu.so; config: $etc_dir/config.toml; units: $systemd_dir; manifest: $manifest)"

# The enforcer, where systemd is the service manager: enabled, and (re)started so that it runs
# the binary just installed.
if [ -f "$systemd_dir/$watch_unit" ]; then
  if [ "$no_watch" = 1 ]; then
    echo "$watch_unit installed, not enabled (--no-watch / VGPU_NO_WATCH=1): systemctl enable --now $watch_unit starts it"
  elif [ -n "$root" ] || [ ! -d /run/systemd/system ] || ! command -v systemctl >/dev/null; then
    echo "$watch_unit installed, not started: systemd is not running here (run 'vgpu watch' under your service manager)"
  elif ! systemd_manages "$systemd_dir"; then
    echo "$watch_unit installed in $systemd_dir, not started: systemd does not load units from there (systemctl link $systemd_dir/$watch_unit)"
  elif systemctl enable --quiet "$watch_unit" && systemctl restart "$watch_unit"; then
    echo "vgpu watch enabled and started: systemctl status $watch_unit; journalctl -u $watch_unit (opt out: ./install.sh --no-watch)"
  else
    echo "install.sh: vgpu is installed, but $watch_unit did not start: see systemctl status $watch_unit" >&2
  fi
fi
