#!/usr/bin/env bash
# The README's OffloadModel run: 2 ranks, 2 slices, 2 chunks, checkpoint_activation; the run ends, its
# loss falls with DDP's (within 1e-4), the host holds the model states and the device less than half of
# DDP's peak.
#   offload_model.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$out"
export OMP_NUM_THREADS=1
"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --global-batch 8 --set offload_model.enabled=true \
    --set offload_model.slices=2 --set offload_model.microbatches=2 --set offload_model.checkpoint_activation=true \
    --steps 4 -o run-offload-model.json
"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --global-batch 8 --steps 4 -o run-ddp.json
"$py" - <<'PY'
import json
om = json.load(open("run-offload-model.json")); ddp = json.load(open("run-ddp.json"))
assert om["plan"]["offload_model"]["enabled"], om["plan"]
assert om["losses"][-1] < om["losses"][0], om["losses"]
# The same training (a tied weight's gradients summed in another order across chunks: not bit for bit).
assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(om["losses"], ddp["losses"])), (om["losses"], ddp["losses"])
dev = lambda r: max(p["device_peak_bytes"] for p in r["peaks"])
host = lambda r: min(p["host_peak_bytes"] for p in r["peaks"])
assert dev(om) < dev(ddp) / 2, (dev(om), dev(ddp))
assert host(om) > dev(ddp) / 2, (host(om), dev(ddp))  # the model states live there
print("offload_model run ok:", om["losses"], dev(om), host(om), "ddp", dev(ddp))
PY
