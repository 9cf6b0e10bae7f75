#!/usr/bin/env bash
# README examples: `zeroplan probe` without -o writes this machine's probe where `--cluster local` finds
# it, and `zeroplan autopilot --model resnet --preset resnet-tiny` runs the whole loop on a CNN and ends
# with its report.
#   local_cluster_resnet.sh ZEROPLAN
set -euo pipefail
zp=$1
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
export XDG_CACHE_HOME=$out/cache
"$zp" -q probe --quick
ls "$out"/cache/zeroplan/probe-*.json >/dev/null
"$zp" -q profile --model gpt --preset gpt2-tiny --batch 2 --repeats 1 -o "$out/gpt.json"
"$zp" -q simulate --model "$out/gpt.json" --cluster local --world-size 2 --global-batch 8 -o "$out/p.json"
grep -q '"cluster"' "$out/p.json"
"$zp" -q autopilot --model resnet --preset resnet-tiny --cluster local --steps 3 --warmup 1 --verify 1 -o "$out/ap"
grep -q 'Model: `resnet` resnet-tiny' "$out/ap/report.md"
test -s "$out/ap/report.html"
# report.html is real HTML (issue #11): tables, headings and inline SVG figures, not the Markdown in <pre>.
html=$out/ap/report.html
for want in '<table>' '<h2>' '<svg'; do
  grep -q "$want" "$html" || { echo "report.html has no $want" >&2; exit 1; }
done
if grep -q -e '<pre>' -e '|---|' "$html"; then echo "report.html wraps Markdown in <pre>" >&2; exit 1; fi
# Every plan that ran has a comparison; at least one ran.
ls "$out"/ap/*/comparison.json >/dev/null
echo "ok: probe cache, --cluster local, autopilot on resnet-tiny: $(ls -d "$out"/ap/*/ | wc -l) plan folders"
