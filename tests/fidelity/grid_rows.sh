#!/usr/bin/env bash
# The fidelity grid's averaging, 16-bit and OffloadModel rows: `zeroplan autopilot --grid --grid-plans g15,...,g20`
# runs LocalSGD every 2 steps (g15) and SlowMo on top of it (g16) with each rank its own node (`run
# --ranks-per-node 1`, predicted on a cluster of one device per node), stage 2 in bf16 (g17) and stage 3
# in fp16 with a dynamic loss scale (g18), each predicted from a profile at its dtype. Every peak within
# 3% of its prediction, SlowMo's slow momentum and previous parameters (8 bytes per parameter) predicted
# and measured, the LocalSGD runs averaged parameters without reducing gradients (one node per rank: no
# gradient all-reduce phase), the 16-bit runs in their dtype; OffloadModel (g19: 2 slices; g20: checkpointed
# slices, 2 chunks) with the model states on the host and less on the device than the replicas of g15;
# 2-stage pipelines (g21 GPipe with except_last checkpointing, g22 1F1B) with a stage per rank; activation
# offload (g23: half the saved tensors at stage 0; g24: all of them at stage 3 with 2 microbatches and no
# prefetch) with the ratio of the saved bytes it sent held on the host.
#   grid_rows.sh ZEROPLAN
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
zp=$1
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
export XDG_CACHE_HOME=$out/cache
# The suite's quick probe (CTest fixture test.probe) when there is one: only memory and the report's
# structure are judged here, not the cluster's speeds.
suite_cluster_args
"$zp" -q autopilot --opt layers=2,hidden=128,heads=4,seq=64,vocab=4096 --verify 1 --steps 4 --warmup 1 \
    "${cluster[@]}" --grid --grid-plans g15,g16,g17,g18,g19,g20,g21,g22,g23,g24 -o "$out/ap"
python3 - "$out/ap" <<'PY'
import json, os, sys
ap = sys.argv[1]
rows = {r["label"]: r for r in json.load(open(os.path.join(ap, "fidelity.json")))["rows"]}
assert sorted(rows) == ["g15", "g16", "g17", "g18", "g19", "g20", "g21", "g22", "g23", "g24"], f"grid plans {sorted(rows)}"
for label, r in rows.items():
    err = (r["predicted_peak_bytes"] - r["measured_peak_bytes"]) / r["measured_peak_bytes"]
    assert abs(err) <= 0.03, f"{label}: peak predicted {r['predicted_peak_bytes']} measured {r['measured_peak_bytes']}"
for label, dtype in (("g17", "bf16"), ("g18", "fp16")):
    rec = json.load(open(os.path.join(ap, "grid", label, "run_record.json")))
    assert rec["plan"]["precision"]["param_dtype"] == dtype, rec["plan"]["precision"]
    prof = json.load(open(os.path.join(ap, f"model_profile_{dtype}.json")))
    assert prof["dtype"] == dtype, prof["dtype"]
for label in ("g15", "g16"):
    rec = json.load(open(os.path.join(ap, "grid", label, "run_record.json")))
    assert rec["plan"]["localsgd_frequency"] == 2, rec["plan"]
    phases = rec["phase_times_s"]
    assert phases.get("average_parameters", 0) > 0 and "all_reduce" not in phases, f"{label}: phases {phases}"
profile = json.load(open(os.path.join(ap, "model_profile.json")))
params = sum(u["params"] * u.get("count", 1) for u in profile["units"])
for kind in ("predicted_peak_bytes", "measured_peak_bytes"):
    slow = rows["g16"][kind] - rows["g15"][kind]
    assert abs(slow - 8 * params) <= 0.02 * 8 * params, f"{kind}: SlowMo adds {slow}, expected {8 * params}"
for label in ("g19", "g20"):  # OffloadModel: the states on the host, slices on the device
    rec = json.load(open(os.path.join(ap, "grid", label, "run_record.json")))
    assert rec["plan"]["offload_model"]["enabled"], rec["plan"]
    assert min(p["host_peak_bytes"] for p in rec["peaks"]) >= 16 * params, f"{label}: host {rec['peaks']}"
    assert rows[label]["measured_peak_bytes"] < rows["g15"]["measured_peak_bytes"], f"{label}: no less on the device"
for label, schedule in (("g21", "gpipe"), ("g22", "1f1b")):  # 2 pipeline stages, a rank each
    rec = json.load(open(os.path.join(ap, "grid", label, "run_record.json")))
    assert rec["plan"]["pipeline_stages"] == 2 and rec["plan"]["pipeline"]["schedule"] == schedule, rec["plan"]
    assert len(rec["stages"]) == 2, rec.get("stages")
for label, ratio in (("g23", 0.5), ("g24", 1.0)):  # activation offload: what went is on the host
    rec = json.load(open(os.path.join(ap, "grid", label, "run_record.json")))
    assert rec["plan"]["offload"]["activations_ratio"] == ratio, rec["plan"]
    off = rec["offloaded_activations"]
    sent, seen = sum(u["offloaded_bytes"] for u in off), sum(u["bytes"] for u in off)
    assert sent > 0 and (ratio < 1 or sent == seen), f"{label}: sent {sent} of {seen}"
    assert abs(sent - ratio * seen) <= 0.1 * seen, f"{label}: sent {sent} of {seen} at ratio {ratio}"
    assert min(p["host_peak_bytes"] for p in rec["peaks"]) >= sent, f"{label}: host {rec['peaks']} < {sent}"
print("grid rows ok:", {k: (r["predicted_peak_bytes"], r["measured_peak_bytes"]) for k, r in rows.items()})
PY
