#!/usr/bin/env bash
# probe --no-collectives (what scripts/gpu-check.sh runs for a one-GPU machine's host): no collective fits,
# one rank per node with every core (the optimizer throughput of the whole host), a valid ClusterProfile
# that a GPU cluster file can extend with its host section; --world-sizes still sets the ranks.
#   probe_host.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$zp" --quiet probe --quick --no-collectives -o "$tmp/host.json"
"$zp" --quiet probe --quick --no-collectives --world-sizes 2 -o "$tmp/host2.json"
"$py" - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
one = json.load(open(f"{tmp}/host.json"))
two = json.load(open(f"{tmp}/host2.json"))
assert one["collectives"] == [], one["collectives"]
assert one["devices_per_node"] == 1, one["devices_per_node"]
assert two["devices_per_node"] == 2, two["devices_per_node"]
assert any("for 1 ranks per node" in p["citation"] for p in one["provenance"].values()), "not one rank per node"
assert any("for 2 ranks per node" in p["citation"] for p in two["provenance"].values())
assert one["host"]["optimizer"]["adam"]["flat_params_per_s"] > 0
# A GPU file extended with this host, as the kit composes it, resolves.
child = {"schema": "zeroplan.cluster/1", "extends": "h200-sxm-141gb", "name": "h200-here", "nodes": 1,
         "devices_per_node": 1, "host": {k: one["host"][k] for k in ("mem_bytes", "cores", "memcpy_bw_bytes_per_s", "optimizer")},
         "provenance": {k: v for k, v in one["provenance"].items() if k.startswith(("host.mem_bytes", "host.cores", "host.memcpy", "host.optimizer"))}}
child["provenance"]["devices_per_node"] = {"source": "probe", "citation": "one GPU"}
json.dump(child, open(f"{tmp}/here.json", "w"))
PY
"$zp" --quiet profile --analytic gpt --layers 2 --hidden 256 --heads 4 --seq 128 --vocab 1000 -o "$tmp/gpt.json"
"$zp" --quiet simulate --model "$tmp/gpt.json" \
  --cluster "$tmp/here.json" --world-size 1 --global-batch 4 --set zero_stage=1 --set offload.optimizer=true -o "$tmp/pred.json"
"$py" - "$tmp" <<'PY'
import json, sys
p = json.load(open(f"{sys.argv[1]}/pred.json"))
assert p["cluster"] == "h200-here", p["cluster"]
assert p["step_time_s"] > 0
print("ok")
PY
