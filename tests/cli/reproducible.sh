#!/usr/bin/env bash
# The same command gives the same losses: a GPT with Dropout (embeddings, attention, residual) on 2 ranks,
# twice, equal to the last bit (before the step's random streams were seeded, every run drew other masks).
#   reproducible.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
run() { "$zp" -q run --model gpt --preset gpt2-tiny --opt dropout=0.1 --nproc 2 --steps 3 --warmup 1 "$@"; }
run -o "$out/a.json"
run -o "$out/b.json"
"$py" - "$out" <<'PY'
import json, sys
d = sys.argv[1]
a, b = (json.load(open(f"{d}/{x}.json"))["losses"] for x in "ab")
print("run 1", a); print("run 2", b)
assert a == b, "the same command gave other losses"
PY
