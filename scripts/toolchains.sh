# shellcheck shell=bash
# Toolchain and cargo-tool pins, in one place. Sourced (not run) by every
# script that needs them:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/toolchains.sh"
#
# and by hand before the commands the docs give, e.g.
#   . scripts/toolchains.sh && (cd fuzz && cargo +"$RDD_NIGHTLY" fuzz list)
#
#   RDD_STABLE             the stable toolchain, with its components and
#   RDD_STABLE_COMPONENTS  targets: read from rust-toolchain.toml, which
#   RDD_STABLE_TARGETS     rustup applies to every plain `cargo` in the
#                          repository (fuzz/ included)
#   RDD_NIGHTLY            the nightly for Miri (scripts/miri.sh) and
#   RDD_NIGHTLY_COMPONENTS cargo-fuzz (scripts/fuzz.sh), pinned by date;
#                          always named explicitly: cargo +"$RDD_NIGHTLY" ...
#   CARGO_FUZZ_VERSION     cargo tools, installed at exactly these versions
#   CBINDGEN_VERSION       with `cargo install --locked`
#
# Functions (each prints what it does on stderr and returns non-zero, with
# a message naming what is needed, when it cannot get there):
#   rdd_ensure_stable      RDD_STABLE with its components and targets
#   rdd_ensure_nightly     RDD_NIGHTLY with its components
#   rdd_ensure_cargo_tool CRATE VERSION CMD...
#                          `CMD --version` must print "NAME VERSION";
#                          otherwise `cargo install CRATE --version =VERSION
#                          --locked --force`
#
# Sourcing also puts cargo's bin directory on PATH (rustup and the cargo
# tools live there).

# (Used by the scripts that source this file.)
# shellcheck disable=SC2034
{
RDD_NIGHTLY=nightly-2026-05-20
RDD_NIGHTLY_COMPONENTS=(miri rust-src rustfmt llvm-tools)
CARGO_FUZZ_VERSION=0.13.2
CBINDGEN_VERSION=0.29.2
}

RDD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RDD_STABLE=$(sed -n 's/^channel *= *"\([^"]*\)".*/\1/p' "$RDD_ROOT/rust-toolchain.toml")
mapfile -t RDD_STABLE_COMPONENTS < <(sed -n 's/^components *= *\[\(.*\)\].*/\1/p' "$RDD_ROOT/rust-toolchain.toml" | grep -o '"[^"]*"' | tr -d '"')
mapfile -t RDD_STABLE_TARGETS < <(sed -n 's/^targets *= *\[\(.*\)\].*/\1/p' "$RDD_ROOT/rust-toolchain.toml" | grep -o '"[^"]*"' | tr -d '"')
if [ -z "$RDD_STABLE" ]; then
  echo "toolchains.sh: no channel in $RDD_ROOT/rust-toolchain.toml" >&2
  # shellcheck disable=SC2317  # exit only when run rather than sourced
  return 1 2>/dev/null || exit 1
fi

case ":$PATH:" in
  *":${CARGO_HOME:-$HOME/.cargo}/bin:"*) ;;
  *) PATH=${CARGO_HOME:-$HOME/.cargo}/bin:$PATH; export PATH ;;
esac

_rdd_say() { echo "toolchains: $*" >&2; }

# _rdd_rustup_host: the host triple rustup names toolchain directories with.
_rdd_rustup_host() {
  (cd / && rustup show 2>/dev/null) | sed -n 's/^Default host: *//p' | head -n 1
}

# _rdd_toolchain_runs NAME: the toolchain is installed and its rustc runs.
_rdd_toolchain_runs() {
  rustup run "$1" rustc --version >/dev/null 2>&1
}

# _rdd_register_local NAME DIR: make an installed toolchain directory DIR
# known to rustup as NAME, without a download. `rustup toolchain link`
# comes first; rustup refuses it for names of official toolchains
# ("invalid custom toolchain name"), and then the directory is linked
# under rustup's own directory name for NAME (NAME-HOST), which is what
# rustup looks up for `+NAME`. A link, not a copy: rustc finds its sysroot
# through it, so both names stay one toolchain for cargo-miri too (it
# rebuilds its shared sysroot, ~/.cache/miri, whenever the toolchain's path
# changes, which breaks Miri builds that share a target directory).
_rdd_register_local() {
  local name=$1 dir=$2 host out
  if out=$(rustup toolchain link "$name" "$dir" 2>&1 | head -n 1; exit "${PIPESTATUS[0]}") &&
     _rdd_toolchain_runs "$name"; then
    _rdd_say "registered $dir as $name (rustup toolchain link)"
    return 0
  fi
  host=$(_rdd_rustup_host)
  [ -n "$host" ] || { _rdd_say "rustup reports no default host"; return 1; }
  _rdd_say "rustup toolchain link refused $name (${out#error: }); linking $dir as $(_rdd_rustup_home)/toolchains/$name-$host instead"
  ln -sfn "$dir" "$(_rdd_rustup_home)/toolchains/$name-$host" || return 1
  _rdd_toolchain_runs "$name"
}

_rdd_rustup_home() { echo "${RUSTUP_HOME:-$HOME/.rustup}"; }

# _rdd_add_missing NAME KIND WANTED...: rustup component/target add for
# what NAME lacks. KIND is component or target.
_rdd_add_missing() {
  local name=$1 kind=$2 have w missing=()
  shift 2
  have=$(rustup "$kind" list --installed --toolchain "$name" 2>/dev/null) || return 1
  for w in "$@"; do
    # components are listed with their target triple, except rust-src
    grep -qE "^$w(-[a-z0-9_]+-[a-z0-9_]+-[a-z0-9_-]+)?$" <<<"$have" || missing+=("$w")
  done
  [ ${#missing[@]} = 0 ] && return 0
  _rdd_say "adding to $name: $kind ${missing[*]}"
  rustup "$kind" add --toolchain "$name" "${missing[@]}"
}

rdd_ensure_stable() {
  local comps targets dir have
  if ! command -v rustup >/dev/null 2>&1; then
    _rdd_say "rustup is not installed; needed: rustup with the $RDD_STABLE toolchain (scripts/install-deps.sh)"
    return 1
  fi
  if ! _rdd_toolchain_runs "$RDD_STABLE"; then
    comps=$(IFS=,; echo "${RDD_STABLE_COMPONENTS[*]}")
    targets=$(IFS=,; echo "${RDD_STABLE_TARGETS[*]}")
    # An installed `stable` of exactly this version is the same toolchain.
    dir=$(_rdd_rustup_home)/toolchains/stable-$(_rdd_rustup_host)
    have=$("$dir/bin/rustc" --version 2>/dev/null | awk '{print $2}')
    if [ "$have" = "$RDD_STABLE" ]; then
      _rdd_say "the installed stable ($dir) is rustc $have: using it as $RDD_STABLE"
      _rdd_register_local "$RDD_STABLE" "$dir" || return 1
    else
      _rdd_say "installing the $RDD_STABLE toolchain (components $comps, targets $targets)"
      if ! RUST_BACKTRACE=0 rustup toolchain install "$RDD_STABLE" --profile minimal -c "$comps" -t "$targets"; then
        _rdd_say "FAILED: rustup could not install $RDD_STABLE and no installed stable is rustc $RDD_STABLE (found: ${have:-none})."
        _rdd_say "needed: the Rust $RDD_STABLE toolchain with ${RDD_STABLE_COMPONENTS[*]} and the targets ${RDD_STABLE_TARGETS[*]}"
        return 1
      fi
    fi
  fi
  if ! _rdd_add_missing "$RDD_STABLE" component "${RDD_STABLE_COMPONENTS[@]}" ||
     ! _rdd_add_missing "$RDD_STABLE" target "${RDD_STABLE_TARGETS[@]}"; then
    _rdd_say "FAILED: $RDD_STABLE lacks components or targets it needs: ${RDD_STABLE_COMPONENTS[*]} ${RDD_STABLE_TARGETS[*]}"
    return 1
  fi
}

rdd_ensure_nightly() {
  local comps dir date
  if ! command -v rustup >/dev/null 2>&1; then
    _rdd_say "rustup is not installed; needed: rustup with the $RDD_NIGHTLY toolchain (scripts/install-deps.sh)"
    return 1
  fi
  if ! _rdd_toolchain_runs "$RDD_NIGHTLY"; then
    comps=$(IFS=,; echo "${RDD_NIGHTLY_COMPONENTS[*]}")
    # An undated `nightly` from the same day is the same build: use it
    # rather than downloading a second copy.
    dir=$(_rdd_rustup_home)/toolchains/nightly-$(_rdd_rustup_host)
    date=$(sed -n 's/^date *= *"\([^"]*\)".*/\1/p' "$dir/lib/rustlib/multirust-channel-manifest.toml" 2>/dev/null | head -n 1)
    if [ -n "$date" ] && [ "nightly-$date" = "$RDD_NIGHTLY" ]; then
      _rdd_say "the installed undated nightly ($dir) has manifest date $date: using it as $RDD_NIGHTLY"
      _rdd_register_local "$RDD_NIGHTLY" "$dir" || return 1
    else
      _rdd_say "installing the $RDD_NIGHTLY toolchain (components $comps)"
      if ! RUST_BACKTRACE=0 rustup toolchain install "$RDD_NIGHTLY" --profile minimal -c "$comps"; then
        _rdd_say "FAILED: rustup could not install $RDD_NIGHTLY, and no installed undated nightly is from that day (found: ${date:-none})."
        _rdd_say "needed: the Rust toolchain $RDD_NIGHTLY with ${RDD_NIGHTLY_COMPONENTS[*]} (for Miri and fuzzing)"
        return 1
      fi
    fi
  fi
  # A directory linked under the dated name (above) follows its target: make
  # sure it is still that day's nightly.
  date=$(sed -n 's/^date *= *"\([^"]*\)".*/\1/p' \
    "$(_rdd_rustup_home)/toolchains/$RDD_NIGHTLY-$(_rdd_rustup_host)/lib/rustlib/multirust-channel-manifest.toml" 2>/dev/null | head -n 1)
  if [ -n "$date" ] && [ "nightly-$date" != "$RDD_NIGHTLY" ]; then
    _rdd_say "FAILED: the toolchain installed as $RDD_NIGHTLY is the nightly of $date; reinstall $RDD_NIGHTLY"
    return 1
  fi
  _rdd_add_missing "$RDD_NIGHTLY" component "${RDD_NIGHTLY_COMPONENTS[@]}" || {
    _rdd_say "FAILED: $RDD_NIGHTLY lacks components it needs: ${RDD_NIGHTLY_COMPONENTS[*]}"
    return 1
  }
}

rdd_ensure_cargo_tool() {
  local crate=$1 version=$2 have
  shift 2
  have=$("$@" --version 2>/dev/null | awk '{print $2}' || true)
  [ "$have" = "$version" ] && return 0
  _rdd_say "installing $crate $version (found: ${have:-none})"
  if ! cargo install "$crate" --version "=$version" --locked --force; then
    _rdd_say "FAILED: cargo install $crate --version =$version --locked"
    return 1
  fi
  have=$("$@" --version 2>/dev/null | awk '{print $2}' || true)
  if [ "$have" != "$version" ]; then
    _rdd_say "FAILED: after installing, '$* --version' reports ${have:-nothing}, not $version (is another $crate earlier on PATH?)"
    return 1
  fi
}
