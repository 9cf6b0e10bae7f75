#!/usr/bin/env bash
# Mixed-precision Adam at stage 0 (bf16 parameters and gradients, fp32 master, two fp32 states): the ZeRO
# paper's 16 bytes per parameter, plus the largest unit's fp32 gradient while the master steps unit by
# unit, measured by `run` and predicted by `simulate`, each within 0.1% of 16 x P + 4 x largest unit
# (a full fp32 copy of every gradient at the step made it 20 x P before).
#   master_bytes.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
model=(--model mlp --opt depth=4,width=1024,in=1024)
bf16=(--set precision.param_dtype=bf16 --set precision.compute_dtype=bf16 --set precision.reduce_dtype=bf16
      --set precision.master_fp32=true)
"$zp" -q profile "${model[@]}" --batch 1 --batches 1 2 --repeats 1 --dtype bf16 -o "$out/profile.json"
"$zp" -q run "${model[@]}" --global-batch 1 --steps 2 "${bf16[@]}" -o "$out/run.json"
"$zp" -q simulate --model "$out/profile.json" --cluster a100-sxm-80gb --world-size 1 --global-batch 1 "${bf16[@]}" \
    -o "$out/pred.json"
"$py" - "$out" <<'PY'
import json, sys
d = sys.argv[1]
prof, run, pred = (json.load(open(f"{d}/{x}.json")) for x in ("profile", "run", "pred"))
params = sum(u["params"] * u.get("count", 1) for u in prof["units"])
largest = max(u["params"] for u in prof["units"])
want = 16 * params + 4 * largest
measured, predicted = run["peaks"][0]["device_peak_bytes"], pred["device"]["peak_bytes"]
print(f"{params:,} parameters, largest unit {largest:,}: 16 P + 4 x largest = {want:,} B; "
      f"measured {measured:,} B ({100 * (measured / want - 1):+.3f}%), predicted {predicted:,} B "
      f"({100 * (predicted / want - 1):+.3f}%)")
assert abs(measured / want - 1) < 1e-3, "measured peak is not 16 bytes per parameter plus one unit"
assert abs(predicted / want - 1) < 1e-3, "predicted peak is not 16 bytes per parameter plus one unit"
PY
