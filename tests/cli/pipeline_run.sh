#!/usr/bin/env bash
# README example: a pipelined run. 2 stages x 2 data-parallel ranks of gpt2-tiny, 1F1B over 4 microbatches,
# the units split by the profile's time balance (--profile): RunRecord.stages has both stages with their
# ranks (stage-major: 0,1 | 2,3) and peaks, a bubble in (0, 1), and the losses equal a single process's
# (same global batch and microbatches of 1). Without --profile a time balance is one line, exit 1.
#   pipeline_run.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=${2:-python3}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$out"
"$zp" -q profile --model gpt --preset gpt2-tiny --batch 4 --batches 1 2 4 --repeats 1 -o gpt2-tiny.json
"$zp" -q run --nproc 4 --model gpt --preset gpt2-tiny --profile gpt2-tiny.json --global-batch 8 \
    --set pipeline_stages=2 --set pipeline.schedule=1f1b --set micro_batch=1 --set microbatches=4 --steps 3 -o run-pipe.json
"$zp" -q run --model gpt --preset gpt2-tiny --global-batch 8 --set micro_batch=1 --set microbatches=8 --steps 3 -o run-one.json
set +e
"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --global-batch 8 --set pipeline_stages=2 --steps 2 2>err.txt
rc=$?
set -e
[ "$rc" = 1 ] || { echo "a time balance without --profile: exit $rc, expected 1"; cat err.txt; exit 1; }
[ "$(wc -l <err.txt)" = 1 ] && grep -q -- "--profile" err.txt || { echo "want one line naming --profile:"; cat err.txt; exit 1; }
"$py" - run-pipe.json run-one.json <<'PY'
import json, math, sys
p = json.load(open(sys.argv[1])); o = json.load(open(sys.argv[2]))
st = p["stages"]
assert [s["ranks"] for s in st] == [[0, 1], [2, 3]], st
assert sum(s["units"] for s in st) == 4 and st[1]["first_unit"] == st[0]["units"], st
assert all(s["device_peak_bytes"] > 0 for s in st), st
assert 0 < p["bubble_fraction"] < 1, p["bubble_fraction"]
for a, b in zip(p["losses"], o["losses"]):
    assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), (p["losses"], o["losses"])
print("stages", [(s["first_unit"], s["units"], s["device_peak_bytes"]) for s in st], "bubble", p["bubble_fraction"],
      "losses", p["losses"])
PY
