#!/usr/bin/env bash
# scripts/ab_prepare.sh COMMIT: the tree of COMMIT (the base of an A/B, e.g. the previous
# main) as .ab/base.tar.gz, for scripts/device.sh's `ab` step, which builds it on the device
# beside this tree: AB_BASE=.ab/base.tar.gz, with .ab in the device call's carry list (the
# device's copy of the tree has no git history to archive from). .ab/ is git-ignored here.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:?usage: scripts/ab_prepare.sh COMMIT}
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")" .ab
grep -qx '/.ab/' "$exclude" 2>/dev/null || echo '/.ab/' >>"$exclude"
git archive --format=tar.gz -o .ab/base.tar.gz "$commit"
git rev-parse "$commit" >.ab/base.commit
echo "$(cat .ab/base.commit) -> .ab/base.tar.gz ($(wc -c <.ab/base.tar.gz) bytes)"
