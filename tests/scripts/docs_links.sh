#!/usr/bin/env bash
# Every relative link in README.md and docs/*.md names a file or folder that exists (anchors aside), the
# README links every docs/ file, and the README stays under 300 lines.
#   docs_links.sh PROJECT_ROOT
set -euo pipefail
root=$1
cd "$root"
bad=0
for f in README.md docs/*.md; do
  dir=$(dirname "$f")
  while IFS= read -r target; do
    path="${target%%#*}"
    [ -z "$path" ] && continue
    case "$path" in http:*|https:*|mailto:*) continue ;; esac
    if [ ! -e "$dir/$path" ]; then echo "$f: link to $target: no such file"; bad=1; fi
  done < <(grep -oE '\]\([^) ]+\)' "$f" | sed -E 's/^\]\(//; s/\)$//')
done
for d in docs/*.md; do
  grep -qF "($d)" README.md || { echo "README.md does not link $d"; bad=1; }
done
lines=$(wc -l < README.md)
[ "$lines" -lt 300 ] || { echo "README.md has $lines lines (under 300 wanted)"; bad=1; }
[ $bad -eq 0 ] && echo "ok: every link resolves; README.md $lines lines"
exit $bad
