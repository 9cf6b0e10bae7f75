#!/usr/bin/env bash
# Memory fidelity: for a few plans of a small GPT on 2 Gloo ranks, the simulator's predicted peak device
# bytes (from a profile of this machine) must be within TOLERANCE of the peak the executor measures
# (counting allocator), per rank. Memory is deterministic enough to test; time fidelity is a report
# (`zeroplan autopilot --grid`), not a test.
# 16-bit plans (bf16 and fp16, stages 0-3, with and without offload; profiled at their dtype) must
# match within MIXED_TOLERANCE on the device and, where the host pool holds anything, on the host.
# resnet-tiny plans (stages 0-3, checkpointing, microbatches, offload) within TOLERANCE, device and host.
# OffloadModel plans (1, 2, 4 slices; 1 and 2 chunks; checkpoint_activation on and off) within TOLERANCE.
# Activation offload ratios 0 to 1 on the GPT and the resnet within TOLERANCE.
# One peak per plan: the ranks of every data-parallel plan measure peaks within 0.5% of each other.
#   memory_fidelity.sh ZEROPLAN [TOLERANCE=0.05] [MIXED_TOLERANCE=0.03] [SECTIONS=gpt,om,mixed,resnet,actoff]
#   (ctest: fidelity.memory_gpt, _mixed, _resnet 0.03 0.03 SECTION; fidelity.memory_offload_model 0.03 0.03 om;
#   fidelity.memory_activation_offload 0.03 0.03 actoff)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
zp=$1; tolerance=${2:-0.05}; mixed_tolerance=${3:-0.03}; sections=",${4:-gpt,om,mixed,resnet,actoff},"
want() { [[ $sections == *",$1,"* ]]; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
model=(--model gpt --opt layers=2,hidden=128,heads=4,seq=64,vocab=4096)
# The suite's one quick probe of this machine (CTest fixture test.probe), else one of its own.
suite_cluster "$zp" "$out/cluster.json"
# The GPT's fp32 profile (every section but resnet's predicts from it).
if want gpt || want om || want mixed || want actoff; then
  "$zp" -q profile "${model[@]}" --batch 4 --batches 1 2 4 --threads 1 --repeats 2 -o "$out/profile.json"
fi
plans=(
  "zero_stage=0"
  "zero_stage=0 checkpointing=all"
  "zero_stage=1 micro_batch=1 microbatches=4"
  "zero_stage=2 micro_batch=2 microbatches=2"
  "zero_stage=2 buckets.reduce_buffer_elems=200000"
  "zero_stage=3 micro_batch=2 microbatches=2"
  "zero_stage=3 buckets.prefetch_depth=2"
  "zero_stage=3 reshard_after_forward=false offload.params=true offload.grads=true offload.optimizer=true"
  "zero_stage=0 checkpointing=all checkpoint_offload=true"
  "zero_stage=3 micro_batch=2 microbatches=2 checkpointing=all checkpoint_offload=true"
)
# (reshard_after_forward follows zero_stage 3 unless set: false keeps this plan as it was measured; with
# resharding it is the grid's g11.)
status=0
# check PLAN_SETS TOLERANCE PROFILE POOLS: simulate, run on 2 ranks, compare the peaks of POOLS.
check() {
  local i=$1 plan=$2 tol=$3 profile=$4 pools=$5
  local sets=()
  for kv in $plan; do sets+=(--set "$kv"); done
  "$zp" -q simulate --model "$profile" --cluster "$out/cluster.json" --world-size 2 --global-batch 8 \
      "${sets[@]}" -o "$out/pred$i.json"
  "$zp" -q run --nproc 2 "${model[@]}" --global-batch 8 "${sets[@]}" --steps 2 --warmup 1 -o "$out/run$i.json"
  "$zp" -q compare --predicted "$out/pred$i.json" --measured "$out/run$i.json" -o "$out/cmp$i.json"
  python3 - "$out/cmp$i.json" "$tol" "$plan" "$pools" <<'PY' || status=1
import json, sys
c = json.load(open(sys.argv[1])); tol = float(sys.argv[2]); pools = sys.argv[4].split(",")
bad = False
for m in c["metrics"]:
    pool = m["name"].split("_peak_bytes")[0]
    if "_peak_bytes" not in m["name"] or pool not in pools or (pool == "host" and m["measured"] == 0):
        continue
    ok = abs(m["rel_error"]) <= tol
    bad |= not ok
    print(f"{sys.argv[3]:<70} {m['name']:<26} predicted {m['predicted']:>12.0f} measured {m['measured']:>12.0f} "
          f"error {100 * m['rel_error']:+6.2f}% {'ok' if ok else 'FAIL'}")
# One peak per plan: every rank of a data-parallel plan within 0.5% of the others' (a pipeline's stages
# hold different units, so they are not compared).
if "pipeline_stages" not in sys.argv[3]:
    for pool in ("device", "host"):
        peaks = [m["measured"] for m in c["metrics"] if m["name"].startswith(pool + "_peak_bytes.rank")]
        if len(peaks) > 1 and max(peaks) > 0:
            spread = max(peaks) / max(min(peaks), 1) - 1
            if spread > 0.005:
                bad = True
                print(f"{sys.argv[3]:<70} {pool} peaks differ between ranks by {100 * spread:.2f}%: {peaks} FAIL")
sys.exit(1 if bad else 0)
PY
}
want gpt && for i in "${!plans[@]}"; do check "$i" "${plans[$i]}" "$tolerance" "$out/profile.json" device,host; done
# fairscale OffloadModel: 1, 2 and 4 slices (of the 4 units), the micro batch of 4 in 1 or 2 chunks,
# with and without checkpoint_activation; the model states on the host, slices visiting the device.
want om && for slices in 1 2 4; do
  for chunks in 1 2; do
    for ckpt in false true; do
      check "om_${slices}_${chunks}_$ckpt" "offload_model.enabled=true offload_model.slices=$slices offload_model.microbatches=$chunks offload_model.checkpoint_activation=$ckpt" \
          "$tolerance" "$out/profile.json" device,host
    done
  done
done
# 16-bit: parameters, gradients and activations in the dtype (profiled at it), fp32 master and state.
mixed_plans=(
  "zero_stage=0"
  "zero_stage=1 micro_batch=2 microbatches=2"
  "zero_stage=2"
  "zero_stage=3"
  "zero_stage=2 offload.grads=true offload.optimizer=true"
  "zero_stage=3 offload.params=true offload.grads=true offload.optimizer=true"
)
# 16-bit plans predicted from the fp32 profile: the activations scale with the dtype, the last unit's
# loss (fp32 in every run) keeps its measured size.
want mixed && for j in 0 2 3; do
  plan="${mixed_plans[$j]} precision.param_dtype=bf16 precision.compute_dtype=bf16 precision.reduce_dtype=bf16"
  check "bf16_from_fp32_$j" "$plan" "$mixed_tolerance" "$out/profile.json" device,host
done
want mixed && for dtype in bf16 fp16; do
  "$zp" -q profile "${model[@]}" --batch 4 --batches 1 2 4 --threads 1 --repeats 2 --dtype "$dtype" \
      -o "$out/profile_$dtype.json"
  scale=none; [ "$dtype" = fp16 ] && scale=dynamic
  for j in "${!mixed_plans[@]}"; do
    plan="${mixed_plans[$j]} precision.param_dtype=$dtype precision.compute_dtype=$dtype precision.reduce_dtype=$dtype precision.loss_scale=$scale"
    check "${dtype}_$j" "$plan" "$mixed_tolerance" "$out/profile_$dtype.json" device,host
  done
done
# Activation offload, one saved tensor at a time (hfai's offload_ratio): ratios 0, 0.1, 0.25, 0.5 and 1 on
# the GPT and on the resnet; on the GPT also with no prefetch, with microbatches, with a checkpointed unit,
# at stage 3 and with 2 pipeline stages (GPipe, 1F1B). Device and host.
gpt_model=("${model[@]}")
resnet_model=(--model resnet --preset resnet-tiny)
profile_resnet() {
  [ -f "$out/profile_resnet.json" ] || "$zp" -q profile "${resnet_model[@]}" --batch 4 --batches 1 2 4 --threads 1 \
      --repeats 2 -o "$out/profile_resnet.json"
}
if want actoff; then
  for r in 0 0.1 0.25 0.5 1; do
    check "actoff_gpt_$r" "offload.activations_ratio=$r" "$tolerance" "$out/profile.json" device,host
  done
  check actoff_gpt_noprefetch "offload.activations_ratio=1 offload.activations_prefetch_bytes=0" "$tolerance" "$out/profile.json" device,host
  check actoff_gpt_micro "offload.activations_ratio=0.5 micro_batch=2 microbatches=2" "$tolerance" "$out/profile.json" device,host
  check actoff_gpt_ckpt "offload.activations_ratio=0.5 checkpointing=2" "$tolerance" "$out/profile.json" device,host
  check actoff_gpt_stage3 "zero_stage=3 offload.activations_ratio=0.25" "$tolerance" "$out/profile.json" device,host
  # 2 pipeline stages (a rank each, 4 microbatches): GPipe with its checkpointed microbatches recomputed on
  # the device, and 1F1B with several microbatches' tensors on the host at once.
  model=("${gpt_model[@]}" --profile "$out/profile.json")
  for sched in gpipe 1f1b; do
    check "actoff_gpt_$sched" "pipeline_stages=2 microbatches=4 micro_batch=2 pipeline.schedule=$sched offload.activations_ratio=0.5" \
        "$tolerance" "$out/profile.json" device,host
  done
  model=("${resnet_model[@]}")
  profile_resnet
  for r in 0 0.1 0.25 0.5 1; do
    check "actoff_resnet_$r" "offload.activations_ratio=$r" "$tolerance" "$out/profile_resnet.json" device,host
  done
  model=("${gpt_model[@]}")
fi
# resnet (convolutions, BatchNorm, pooling) at every stage, checkpointed, with microbatches and offload:
# the same bar as the GPT (layer4 holds 74% of the parameters, so how long one unit's gradient lives
# decides the peak).
want resnet || exit $status
model=("${resnet_model[@]}")
profile_resnet
resnet_plans=(
  "zero_stage=0"
  "zero_stage=0 checkpointing=all"
  "zero_stage=1 micro_batch=1 microbatches=4"
  "zero_stage=2 micro_batch=2 microbatches=2"
  "zero_stage=3"
  "zero_stage=3 offload.params=true offload.grads=true offload.optimizer=true"
  "zero_stage=1 offload.optimizer=true"
  "zero_stage=0 checkpointing=all checkpoint_offload=true"
  "zero_stage=3 checkpointing=all checkpoint_offload=true"
)
for k in "${!resnet_plans[@]}"; do
  check "resnet_$k" "${resnet_plans[$k]}" "$tolerance" "$out/profile_resnet.json" device,host
done
exit $status
