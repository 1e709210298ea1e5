#!/usr/bin/env bash
# scripts/ab_prepare.sh COMMIT [NAME]: the tree of COMMIT as .ab/NAME.tar.gz (NAME default
# base: the base of an A/B, e.g. the previous main), for scripts/device.sh, which builds it
# on the device beside this tree: AB_BASE=.ab/base.tar.gz, and for extra builds of the
# ab-formats step AB_MORE="NAME:.ab/NAME.tar.gz ...", with .ab in the device call's carry
# list (the device's copy of the tree has no git history to archive from). .ab/ is
# git-ignored here; .ab/NAME.commit names the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:?usage: scripts/ab_prepare.sh COMMIT [NAME]}
name=${2:-base}
# (not ending in a digit: device.sh numbers a build's runs after its name)
[[ "$name" =~ ^[a-z]([a-z0-9_]*[a-z_])?$ ]] || { echo "ab_prepare.sh: NAME is lower-case letters, digits, _, not ending in a digit" >&2; exit 2; }
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")" .ab
grep -qx '/.ab/' "$exclude" 2>/dev/null || echo '/.ab/' >>"$exclude"
git archive --format=tar.gz -o ".ab/$name.tar.gz" "$commit"
git rev-parse "$commit" >".ab/$name.commit"
echo "$(cat ".ab/$name.commit") -> .ab/$name.tar.gz ($(wc -c <".ab/$name.tar.gz") bytes)"
