#!/usr/bin/env bash
# The user's own model through the whole loop: a small CNN written in PyTorch (tests/profiles/zoo/make_scripted_cnn.py), scripted,
# then profile -> tune -> run on 2 Gloo ranks -> compare with --task classify. The tuned plan's
# predicted device peak must be within TOLERANCE of the measured one on every rank, and the loss fall.
#   torchscript_cnn.sh ZEROPLAN PYTHON [TOLERANCE=0.05]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
zp=$1; py=$2; tolerance=${3:-0.05}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
"$py" "$here/../profiles/zoo/make_scripted_cnn.py" "$out/cnn.pt" 10
model=(--torchscript "$out/cnn.pt" --input-shape 3,16,16 --task classify --classes 10)
# The suite's one quick probe of this machine (CTest fixture test.probe), else one of its own.
suite_cluster "$zp" "$out/cluster.json"
"$zp" -q profile "${model[@]}" --batch 4 --batches 1,2,4 --threads 1 --repeats 2 -o "$out/profile.json"
# A budget below the default plan's need, so the tuner has to pick a memory-saving plan.
"$zp" -q tune --model "$out/profile.json" --cluster "$out/cluster.json" --world-size 2 --global-batch 8 \
    --device-memory-gib 0.004 --knobs zero_stage,reshard_after_forward,checkpointing,micro_batch -o "$out/tune"
"$zp" -q simulate --model "$out/profile.json" --cluster "$out/cluster.json" --plan "$out/tune/plan.json" \
    -o "$out/prediction.json"
"$zp" -q run --nproc 2 "${model[@]}" --plan "$out/tune/plan.json" --set optimizer.lr=0.01 --steps 10 --warmup 1 \
    -o "$out/run.json"
"$zp" -q compare --predicted "$out/prediction.json" --measured "$out/run.json" -o "$out/comparison.json"
"$py" - "$out" "$tolerance" <<'PY'
import json, sys
out, tol = sys.argv[1], float(sys.argv[2])
plan = json.load(open(f"{out}/tune/plan.json"))
run = json.load(open(f"{out}/run.json"))
cmp = json.load(open(f"{out}/comparison.json"))
print(f"plan: zero_stage {plan['zero_stage']} micro_batch {plan['micro_batch']} x {plan['microbatches']} "
      f"checkpointing {plan['checkpointing']}")
bad = False
# The profile and the run name the model alike (its file): compare does not warn that they differ.
model_warnings = [w for w in cmp.get("warnings", []) if "model" in w and "but the run of" in w]
if model_warnings:
    bad = True
    print("FAIL: " + "; ".join(model_warnings))
peaks = [m for m in cmp["metrics"] if m["name"].startswith("device_peak_bytes")]
assert peaks, "no device peak metric in the comparison"
for m in peaks:
    ok = abs(m["rel_error"]) <= tol
    bad |= not ok
    print(f"{m['name']:<26} predicted {m['predicted']:>10.0f} measured {m['measured']:>10.0f} "
          f"error {100 * m['rel_error']:+6.2f}% {'ok' if ok else 'FAIL'}")
losses = run["losses"]
first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} (mean of the first three {first:.4f}, last three {last:.4f})")
if not last < first:
    print("FAIL: the loss did not fall"); bad = True
sys.exit(1 if bad else 0)
PY
