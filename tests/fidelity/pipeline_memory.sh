#!/usr/bin/env bash
# Pipeline memory fidelity: for pipelined plans of gpt2-tiny, the simulator's predicted peak device bytes
# of every stage (Prediction.stages[s].device) must be within TOLERANCE of the largest peak the executor
# measures on that stage's ranks (RunRecord.stages[s].device_peak_bytes, counting allocator): 2 stages on
# 2 Gloo ranks and 2 stages x 2 data-parallel ranks on 4 (ZeRO 0-2 inside), GPipe with each checkpoint mode
# and 1F1B. gpt2-tiny's units are embed, block0, block1, head; the splits are given ([2,2]: the tied token
# embedding crosses the stages; [3,1]: the head alone) so the test checks the same stages every time, and
# one plan takes the profile's time balance (run --profile splits the units as simulate does).
#   pipeline_memory.sh ZEROPLAN [TOLERANCE=0.03]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
zp=$1; tolerance=${2:-0.03}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
model=(--model gpt --preset gpt2-tiny)
# The suite's one quick probe of this machine (CTest fixture test.probe), else one of its own.
suite_cluster "$zp" "$out/cluster.json"
# 4 ranks on this one machine: the same cluster with 4 rank slots per node (memory does not depend on it).
python3 - "$out/cluster.json" "$out/cluster4.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["devices_per_node"] = 4; json.dump(c, open(sys.argv[2], "w"))
PY
"$zp" -q profile "${model[@]}" --batch 4 --batches 1 2 4 --threads 1 --repeats 2 -o "$out/profile.json"
# 16-bit plans are judged against a profile at their dtype (as fidelity.memory does).
"$zp" -q profile "${model[@]}" --batch 4 --batches 1 2 4 --threads 1 --repeats 1 --dtype bf16 -o "$out/profile_bf16.json"
bf16="precision.param_dtype=bf16 precision.compute_dtype=bf16 precision.reduce_dtype=bf16"
# world size | plan
plans=(
  "2|pipeline_stages=2 pipeline.balance=[2,2] micro_batch=2 microbatches=4 pipeline.checkpoint=never"
  "2|pipeline_stages=2 pipeline.balance=[2,2] micro_batch=2 microbatches=4 pipeline.checkpoint=always"
  "2|pipeline_stages=2 pipeline.balance=[2,2] micro_batch=2 microbatches=4 pipeline.checkpoint=except_last"
  "2|pipeline_stages=2 pipeline.balance=[2,2] micro_batch=2 microbatches=4 pipeline.schedule=1f1b pipeline.checkpoint=never"
  "2|pipeline_stages=2 pipeline.balance=[3,1] micro_batch=2 microbatches=4 pipeline.checkpoint=except_last"
  "2|pipeline_stages=2 pipeline.balance=[3,1] micro_batch=2 microbatches=4 pipeline.schedule=1f1b pipeline.checkpoint=never"
  "2|pipeline_stages=2 micro_batch=2 microbatches=4 pipeline.checkpoint=except_last"
  "4|pipeline_stages=2 pipeline.balance=[2,2] micro_batch=2 microbatches=2 pipeline.checkpoint=never zero_stage=1"
  "4|pipeline_stages=2 pipeline.balance=[2,2] micro_batch=1 microbatches=4 pipeline.schedule=1f1b pipeline.checkpoint=never zero_stage=2"
  "4|pipeline_stages=2 pipeline.balance=[2,2] micro_batch=2 microbatches=2 pipeline.checkpoint=always zero_stage=2"
  "4|pipeline_stages=2 pipeline.balance=[3,1] micro_batch=1 microbatches=4 pipeline.schedule=1f1b pipeline.checkpoint=never zero_stage=0"
  "2|pipeline_stages=2 pipeline.balance=[2,2] micro_batch=2 microbatches=4 pipeline.checkpoint=never $bf16"
  "4|pipeline_stages=2 pipeline.balance=[2,2] micro_batch=1 microbatches=4 pipeline.schedule=1f1b pipeline.checkpoint=never zero_stage=2 $bf16"
)
status=0
for i in "${!plans[@]}"; do
  world=${plans[$i]%%|*}; plan=${plans[$i]#*|}
  sets=()
  for kv in $plan; do sets+=(--set "$kv"); done
  cluster=$out/cluster.json; [ "$world" -gt 2 ] && cluster=$out/cluster4.json
  profile=$out/profile.json; case "$plan" in *bf16*) profile=$out/profile_bf16.json ;; esac
  "$zp" -q simulate --model "$profile" --cluster "$cluster" --world-size "$world" --global-batch 8 \
      "${sets[@]}" -o "$out/pred$i.json"
  "$zp" -q run --nproc "$world" "${model[@]}" --profile "$out/profile.json" --world-size "$world" --global-batch 8 \
      "${sets[@]}" --steps 2 --warmup 1 -o "$out/run$i.json"
  python3 - "$out/pred$i.json" "$out/run$i.json" "$tolerance" "$world ranks: $plan" <<'PY' || status=1
import json, sys
p = json.load(open(sys.argv[1])); r = json.load(open(sys.argv[2])); tol = float(sys.argv[3])
bad = False
assert len(p["stages"]) == len(r["stages"]), (len(p["stages"]), len(r["stages"]))
for s, (ps, rs) in enumerate(zip(p["stages"], r["stages"])):
    pred, meas = ps["device"]["peak_bytes"], rs["device_peak_bytes"]
    err = (pred - meas) / meas
    ok = abs(err) <= tol
    bad |= not ok
    print(f"{sys.argv[4]:<100} stage {s} predicted {pred:>10} measured {meas:>10} error {100 * err:+6.2f}% "
          f"{'ok' if ok else 'FAIL'}")
print(f"{sys.argv[4]:<100} bubble predicted {100 * p['bubble_fraction']:.1f}% measured {100 * r['bubble_fraction']:.1f}%")
sys.exit(1 if bad else 0)
PY
done
exit $status
