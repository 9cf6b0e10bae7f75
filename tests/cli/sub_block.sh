#!/usr/bin/env bash
# README example: gpt cut at sub-block granularity (--opt units=sub-block: block<l>.attn, block<l>.mlp,
# FSDP's wrap of attention and MLP apart). The profile has those units; a 2-rank stage-3 run of the same
# cut trains exactly as the block cut does (same parameters, same arithmetic: losses within 1e-6), and
# the simulator, given the sub-block profile, predicts its device and host peaks within 3% (the largest
# over the ranks and 6 steps: a stage-3 rank now and then misses the peak by when its gathers land).
#   sub_block.sh ZEROPLAN PYTHON
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
zp=$1; py=$2
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$out"
export OMP_NUM_THREADS=1
sub=(--model gpt --preset gpt2-tiny --opt units=sub-block)
plan=(--world-size 2 --global-batch 4 --set zero_stage=3 --set offload.optimizer=true)
# The suite's one quick probe of this machine (CTest fixture test.probe), else one of its own.
suite_cluster "$zp" cluster.json
"$zp" -q profile "${sub[@]}" --batch 2 --batches 1 2 --threads 1 --repeats 1 -o model.json
"$zp" -q simulate --model model.json --cluster cluster.json "${plan[@]}" -o prediction.json
"$zp" -q run --nproc 2 --threads 1 "${sub[@]}" "${plan[@]}" --steps 6 --warmup 1 -o run-sub.json
"$zp" -q run --nproc 2 --threads 1 --model gpt --preset gpt2-tiny "${plan[@]}" --steps 3 --warmup 1 -o run-block.json
"$py" - <<'PY'
import json
model = json.load(open("model.json")); pred = json.load(open("prediction.json"))
sub = json.load(open("run-sub.json")); block = json.load(open("run-block.json"))
names = [u["name"] for u in model["units"]]
assert names == ["embed", "block0.attn", "block0.mlp", "block1.attn", "block1.mlp", "head"], names
assert [u["type"] for u in model["units"]][1:3] == ["Attention", "MLP"], model["units"]
assert [u["name"] for u in sub["units"]] == names, sub["units"]
assert len(block["losses"]) == 3 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(sub["losses"], block["losses"])), (sub["losses"], block["losses"])
assert sub["losses"][-1] < sub["losses"][0], sub["losses"]
for pool in ("device", "host"):
    measured = max(p[pool + "_peak_bytes"] for p in sub["peaks"])
    predicted = pred[pool]["peak_bytes"]
    err = predicted / measured - 1
    print(f"{pool}: predicted {predicted} measured {measured} ({err:+.2%})")
    assert abs(err) <= 0.03, (pool, predicted, measured)
print("sub-block gpt ok:", sub["losses"])
PY
