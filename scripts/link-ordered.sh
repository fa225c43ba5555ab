#!/usr/bin/env bash
# The linker for x86_64 Linux builds (.cargo/config.toml names it). It runs `cc` with the
# arguments rustc gives it; for the release `gpuwatch` binary it also hands the linker a
# symbol ordering file, so the functions listed in collector/text-order.txt (those the agent
# runs to start, to sit idle and to report a fault) are laid out together at the start of
# .text.
#
# Why: the kernel maps a file-backed page fault together with up to 64 KiB of neighbouring
# cached pages ("fault-around"). The agent runs about 1.3 MiB of code at start and at idle,
# but spread over a 27 MB text segment it makes about 10 MiB of the binary resident; the
# same functions laid out together make under 2 MiB resident. The idle RSS then no longer
# depends on where the compiler happened to place them.
#
# The list names functions demangled and without the hashes of their symbols (these differ
# between builds), so one list serves every build until the code it names is renamed;
# benches/scripts/text-order.sh regenerates it and checks a built binary against it.
#
# Every other link (debug builds, tests, build scripts, other binaries) is `cc "$@"`
# unchanged. The ordering needs LLD (rustc's default linker on this target since 1.90, which
# it selects with -fuse-ld=lld); with another linker the binary links unordered.
#
#   scripts/link-ordered.sh --names FILE...   prints "normalised-name<TAB>symbol" for every
#                                              function FILE defines (used by text-order.sh)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
order_list="$here/../collector/text-order.txt"

# Defined function symbols of the object files and archives given, as
# "normalised demangled name<TAB>symbol". Normalising drops what differs between builds:
# legacy symbols' trailing hash (::h0123…), v0 symbols' crate disambiguators (std[0a1b…])
# and the suffix ThinLTO gives promoted local symbols (.llvm.NNN).
function_names() {
  local syms
  syms="$(mktemp)"
  nm --defined-only "$@" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[tTwW]$/ { print $3 }' \
    | sort -u >"$syms"
  c++filt <"$syms" \
    | sed -E 's/::h[0-9a-f]{16}$//; s/\[[0-9a-f]+\]//g; s/( \[clone )?\.llvm\.[0-9]+\]?//g' \
    | paste - "$syms"
  rm -f "$syms"
}

if [ "${1:-}" = "--names" ]; then
  shift
  function_names "$@"
  exit 0
fi

# The arguments rustc passes, expanded from an @file when it used one (long command lines).
args=()
for a in "$@"; do
  if [[ "$a" == @* && -f "${a#@}" ]]; then
    while IFS= read -r line; do args+=("$line"); done <"${a#@}"
  else
    args+=("$a")
  fi
done

out="" prev="" lld=0
inputs=()
for a in "${args[@]}"; do
  [ "$prev" = "-o" ] && out="$a"
  case "$a" in
    -fuse-ld=lld) lld=1 ;;
    *.o | *.rlib) inputs+=("$a") ;;
  esac
  prev="$a"
done

case "$out" in
  */release/deps/gpuwatch-*) ;;
  *) exec cc "$@" ;;
esac
if [ "$lld" != 1 ] || [ ! -f "$order_list" ] || [ "${#inputs[@]}" = 0 ] \
  || ! command -v nm >/dev/null || ! command -v c++filt >/dev/null; then
  exec cc "$@"
fi

order="$(mktemp)"
trap 'rm -f "$order"' EXIT
# The symbols of each listed name, in the list's order (every instance of a generic
# function shares its name, and all of them go together).
function_names "${inputs[@]}" \
  | awk -F'\t' 'NR == FNR { if ($0 !~ /^#/ && $0 != "" && !($0 in rank)) rank[$0] = FNR; next }
                ($1 in rank) { print rank[$1] "\t" $2 }' "$order_list" - \
  | sort -s -n -k1,1 | cut -f2 >"$order"
cc "$@" "-Wl,--symbol-ordering-file=$order" -Wl,--no-warn-symbol-ordering
