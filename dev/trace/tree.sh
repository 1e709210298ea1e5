#!/usr/bin/env bash
# dev/trace/tree.sh: a scratch copy of this tree with the decode kernels' clock64 phase trace
# compiled in (dev/trace/trace.cuh, placed by dev/trace/instrument.patch). The product's
# kernels carry no trace points; a trace build is always a build of such a copy, in a
# directory of its own (scripts/device.sh trace).
#
#   bash dev/trace/tree.sh DEST            DEST holds the instrumented tree (made or updated)
#   bash dev/trace/tree.sh --check         exit 0 when the patch applies to the tree as it is
#   bash dev/trace/tree.sh --refresh DEST  rewrite instrument.patch from DEST's edited sources
#
# Updating DEST rewrites only the files whose bytes changed, so that a build directory of
# DEST rebuilds only what changed. DEST may not be the tree itself nor lie inside it, except
# under a build* folder (ignored by git and left out of the copy). After a kernel edit that
# moves a trace point's neighbourhood the patch stops applying: make DEST from the last tree
# it applies to (or add the points by hand to a fresh copy), then --refresh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(realpath "$here/../..")
patch_file=$here/instrument.patch
marker=.megamoe-trace-tree

die() { echo "dev/trace/tree.sh: $*" >&2; exit 1; }
command -v patch >/dev/null || die "needs GNU patch"

apply() {  # dir [patch args...]: apply the patch below dir
  local dir=$1
  shift
  patch -p1 --forward --batch --no-backup-if-mismatch -s -d "$dir" "$@" <"$patch_file" ||
    die "instrument.patch no longer applies to $root (see --refresh in this script's header)"
}

if [ "${1:-}" = --check ]; then
  apply "$root" --dry-run
  echo "instrument.patch applies to $root"
  exit 0
fi

refresh=0
if [ "${1:-}" = --refresh ]; then
  refresh=1
  shift
fi
[ $# -eq 1 ] || die "usage: tree.sh DEST | --check | --refresh DEST"
dest=$(realpath -m "$1")
case "$dest/" in
  "$root"/build*/*) ;;
  "$root"/*) die "DEST ($dest) is the tree or inside it; use a build* folder or a path outside" ;;
esac
mkdir -p "$dest"

if [ $refresh = 1 ]; then
  [ -f "$dest/$marker" ] || die "$dest was not made by this script"
  {
    echo "The decode kernels' phase points (dev/trace/trace.cuh's macros), applied by dev/trace/tree.sh"
    echo "to a scratch copy of the tree, never to the tree itself. When a hunk no longer applies, edit"
    echo "the kernels in a scratch copy and regenerate this file with diff -u against the tree."
    echo
    (cd "$dest" && find src -type f ! -path src/cuda/kernels/trace.cuh | LC_ALL=C sort) | while read -r f; do
      [ -f "$root/$f" ] || die "$f exists in $dest only"
      diff -u -p --label "a/$f" --label "b/$f" "$root/$f" "$dest/$f" || [ $? -eq 1 ]
    done
  } >"$patch_file.new"
  mv "$patch_file.new" "$patch_file"
  echo "instrument.patch rewritten from $dest"
  exit 0
fi

if [ -n "$(ls -A "$dest")" ] && [ ! -f "$dest/$marker" ]; then
  die "$dest is neither empty nor a tree made by this script"
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# Everything a build reads; build folders, environments and version control stay out.
for entry in "$root"/* "$root"/.[!.]*; do
  case "$(basename "$entry")" in
    build* | .git | .venv | .deps | .ab | _skbuild | dist | .whl | .pytest_cache) continue ;;
  esac
  cp -R "$entry" "$stage/"
done
cp "$here/trace.cuh" "$stage/src/cuda/kernels/trace.cuh"
apply "$stage"
touch "$stage/$marker"
# Sync: changed and new files copied, files gone from the tree removed.
(cd "$stage" && find . -type f) | while read -r f; do
  if ! cmp -s "$stage/$f" "$dest/$f"; then
    mkdir -p "$(dirname "$dest/$f")"
    cp "$stage/$f" "$dest/$f"
  fi
done
(cd "$dest" && find . -type f) | while read -r f; do
  [ -e "$stage/$f" ] || rm -f "$dest/$f"
done
echo "instrumented tree in $dest"
