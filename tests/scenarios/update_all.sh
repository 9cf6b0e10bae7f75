#!/usr/bin/env bash
# Regenerate every scenario's expected output from the current build (review the diff before committing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
zeroplan=${1:-$here/../../build/zeroplan}
for d in "$here"/*/; do [ -f "$d/args" ] && "$here/run_scenario.sh" "$zeroplan" "$d" --update; done
