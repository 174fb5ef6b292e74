#!/usr/bin/env bash
# e2e/check-crds.sh — fail when the Helm chart's copy of our CRDs
# (charts/tollgate/crds) differs from the repository's crds/ (written by
# `tollgate crdgen`). Only *.yaml / *.yml files count; a missing crds/ is an
# empty one. Run from CI (e.g. .ci/run or e2e/test-all.sh).
#
#   e2e/check-crds.sh          check; exit 1 and show the differences if stale
#   e2e/check-crds.sh --fix    make the chart's copy equal to crds/
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$ROOT/crds
DST=$ROOT/charts/tollgate/crds

# yaml_files DIR: the YAML file names in DIR, sorted, one a line.
yaml_files() {
  [[ -d $1 ]] || return 0
  find "$1" -maxdepth 1 -type f \( -name '*.yaml' -o -name '*.yml' \) -printf '%f\n' | LC_ALL=C sort
}

if [[ ${1:-} == --fix ]]; then
  mkdir -p "$DST"
  while read -r f; do
    [[ -n $f ]] && rm -f "$DST/$f"
  done < <(yaml_files "$DST")
  while read -r f; do
    [[ -n $f ]] && cp "$SRC/$f" "$DST/$f"
  done < <(yaml_files "$SRC")
  echo "check-crds: copied $(yaml_files "$SRC" | grep -c . || true) file(s) from crds/ to charts/tollgate/crds/"
  exit 0
elif [[ $# -gt 0 ]]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
fi

stale=0
if ! diff <(yaml_files "$SRC") <(yaml_files "$DST") >/dev/null; then
  echo "check-crds: the file lists differ (< crds/, > charts/tollgate/crds/):" >&2
  diff <(yaml_files "$SRC") <(yaml_files "$DST") >&2 || true
  stale=1
fi
while read -r f; do
  [[ -n $f && -f $DST/$f ]] || continue
  if ! cmp -s "$SRC/$f" "$DST/$f"; then
    echo "check-crds: $f differs:" >&2
    diff -u "$SRC/$f" "$DST/$f" | head -n 40 >&2 || true
    stale=1
  fi
done < <(yaml_files "$SRC")

if ((stale)); then
  echo "check-crds: charts/tollgate/crds is stale; run e2e/check-crds.sh --fix and commit" >&2
  exit 1
fi
echo "check-crds: charts/tollgate/crds matches crds/ ($(yaml_files "$SRC" | grep -c . || true) file(s))"
