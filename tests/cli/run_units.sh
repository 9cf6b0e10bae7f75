#!/usr/bin/env bash
# A 2-rank gpt2-tiny run records what its ranks measured, and compare judges it per unit:
#   environment.threads_per_rank is the ranks' --threads 1, not the launcher's OMP_NUM_THREADS=2;
#   units: every model unit in order, fwd_s and bwd_s > 0, their sum below the median step time;
#   compare of that run against the simulation of a profile of it prints a units row per unit and
#   phase (measured against predicted), and the Comparison holds them.
#   run_units.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_workdir
export OMP_NUM_THREADS=2
common=(--world-size 2 --global-batch 4)
# The suite's one quick probe of this machine (CTest fixture test.probe), else one of its own.
suite_cluster "$zp" cluster.json
"$zp" -q profile --model gpt --preset gpt2-tiny --batch 2 --batches 2 --repeats 2 --threads 1 -o model.json || fail "profile"
"$zp" -q simulate --model model.json --cluster cluster.json "${common[@]}" -o prediction.json || fail "simulate"
"$zp" -q run --nproc 2 --threads 1 --model gpt --preset gpt2-tiny "${common[@]}" --steps 4 --warmup 1 -o run.json ||
  fail "run"
"$zp" compare --predicted prediction.json --measured run.json --model model.json -o comparison.json 2>compare.txt ||
  { cat compare.txt; fail "compare"; }
cat compare.txt
"$py" - <<'PY' || exit 1
import json, re, sys
run = json.load(open("run.json"))
model = json.load(open("model.json"))
comparison = json.load(open("comparison.json"))
errors = []
def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        errors.append(what)
check(run["environment"]["threads_per_rank"] == 1,
      f"threads_per_rank is the ranks' --threads 1 (got {run['environment']['threads_per_rank']})")
names = [u["name"] for u in model["units"]]
units = run.get("units", [])
check([u["name"] for u in units] == names, f"the run has every unit in order: {[u['name'] for u in units]} == {names}")
check(all(u["fwd_s"] > 0 and u["bwd_s"] > 0 for u in units), "every unit's fwd_s and bwd_s > 0")
total = sum(u["fwd_s"] + u["bwd_s"] for u in units) * run["plan"]["microbatches"]
check(0 < total < run["step_time_median_s"],
      f"units' forward + backward {total * 1e3:.3f} ms < median step {run['step_time_median_s'] * 1e3:.3f} ms")
rows = comparison.get("units", [])
check([u["name"] for u in rows] == names, "the Comparison has a row per unit")
check(all([m["name"] for m in u["metrics"]] == ["fwd_s", "bwd_s"] and all(m["predicted"] > 0 and m["measured"] > 0
          for m in u["metrics"]) for u in rows), "each with fwd_s and bwd_s, predicted and measured > 0")
text = open("compare.txt").read()
check("units (one microbatch; not gating):" in text, "compare prints the units table")
for n in names:
    for phase in ("fwd_s", "bwd_s"):
        check(re.search(rf"^  {re.escape(n)} {phase} +[0-9.]+ ms +[0-9.]+ ms +[-+][0-9.]+%$", text, re.M) is not None,
              f"compare prints {n} {phase}: predicted, measured, error")
sys.exit(1 if errors else 0)
PY
