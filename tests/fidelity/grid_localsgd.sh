#!/usr/bin/env bash
# The fidelity grid's averaging rows: `zeroplan autopilot --grid --grid-plans g15,g16` runs LocalSGD
# every 2 steps (g15) and SlowMo on top of it (g16) with each rank its own node (`run --ranks-per-node
# 1`, predicted on a cluster of one device per node). Both peaks within 3% of the predictions, SlowMo's
# slow momentum and previous parameters (8 bytes per parameter) predicted and measured, and the runs
# averaged parameters without reducing gradients (one node per rank: no gradient all-reduce phase).
#   grid_localsgd.sh ZEROPLAN
set -euo pipefail
zp=$1
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
export XDG_CACHE_HOME=$out/cache
"$zp" -q autopilot --opt layers=2,hidden=128,heads=4,seq=64,vocab=4096 --verify 1 --steps 4 --warmup 1 \
    --grid --grid-plans g15,g16 -o "$out/ap"
python3 - "$out/ap" <<'PY'
import json, os, sys
ap = sys.argv[1]
rows = {r["label"]: r for r in json.load(open(os.path.join(ap, "fidelity.json")))["rows"]}
assert sorted(rows) == ["g15", "g16"], f"grid plans {sorted(rows)}"
for label, r in rows.items():
    err = (r["predicted_peak_bytes"] - r["measured_peak_bytes"]) / r["measured_peak_bytes"]
    assert abs(err) <= 0.03, f"{label}: peak predicted {r['predicted_peak_bytes']} measured {r['measured_peak_bytes']}"
    rec = json.load(open(os.path.join(ap, "grid", label, "run_record.json")))
    assert rec["plan"]["localsgd_frequency"] == 2, rec["plan"]
    phases = rec["phase_times_s"]
    assert phases.get("average_parameters", 0) > 0 and "all_reduce" not in phases, f"{label}: phases {phases}"
profile = json.load(open(os.path.join(ap, "model_profile.json")))
params = sum(u["params"] * u.get("count", 1) for u in profile["units"])
for kind in ("predicted_peak_bytes", "measured_peak_bytes"):
    slow = rows["g16"][kind] - rows["g15"][kind]
    assert abs(slow - 8 * params) <= 0.02 * 8 * params, f"{kind}: SlowMo adds {slow}, expected {8 * params}"
print("grid LocalSGD/SlowMo ok:", {k: (r["predicted_peak_bytes"], r["measured_peak_bytes"]) for k, r in rows.items()})
PY
