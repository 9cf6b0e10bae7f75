#!/usr/bin/env bash
# `zeroplan autopilot --grid --grid-plans ... --rounds 2`: two grid plans of a small GPT on 2 Gloo ranks,
# each run twice (interleaved); each plan is judged on its median round (the lower of two), and the
# report and fidelity.json carry every round's measured step.
#   grid_rounds.sh ZEROPLAN
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
zp=$1
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
export XDG_CACHE_HOME=$out/cache   # a probe of its own, not the user's cached one
# The suite's quick probe (CTest fixture test.probe) when there is one: only memory and the report's
# structure are judged here, not the cluster's speeds.
suite_cluster_args
"$zp" -q autopilot --opt layers=2,hidden=128,heads=4,seq=64,vocab=4096 --verify 1 --steps 3 --warmup 1 \
    "${cluster[@]}" --grid --grid-plans g01,g04 --rounds 2 -o "$out/ap"
python3 - "$out/ap" <<'PY'
import json, os, sys
ap = sys.argv[1]
f = json.load(open(os.path.join(ap, "fidelity.json")))
labels = [r["label"] for r in f["rows"]]
assert labels == ["g01", "g04"], f"grid plans {labels}, expected g01 and g04 only"
for r in f["rows"]:
    rounds = r["measured_time_rounds_s"]
    assert len(rounds) == 2 and rounds == sorted(rounds), f"{r['label']}: rounds {rounds}"
    assert r["measured_time_s"] == rounds[0], f"{r['label']}: judged on {r['measured_time_s']}, rounds {rounds}"
    got = []
    for k in (1, 2):
        rec = json.load(open(os.path.join(ap, "grid", r["label"], f"round{k}", "run_record.json")))
        got.append(rec["step_time_median_s"])
    assert sorted(got) == rounds, f"{r['label']}: run records {got}, fidelity rounds {rounds}"
report = open(os.path.join(ap, "report.md")).read()
assert report.count("(rounds ") == 2, "report rows lack the rounds' spread"
html = open(os.path.join(ap, "report.html")).read()
assert "<table>" in html and "<pre>" not in html, "report.html is not real HTML"
assert "Fidelity grid: step time" in html and "Fidelity grid: peak device memory" in html, "no fidelity plots"
# The profile was taken under the runs' conditions: both local ranks computing each unit at once, the
# executor's backward; the probe's core contention (when it measured any) comes with its provenance.
prof = json.load(open(os.path.join(ap, "model_profile.json")))
assert prof.get("concurrent_ranks") == 2 and prof.get("backward_adds_grads") is True, \
    f"profile conditions {prof.get('concurrent_ranks')}, {prof.get('backward_adds_grads')}"
# The tuner may vary the precision: the profile it tuned with holds every unit's times at bf16 and fp16.
assert all(sorted(u.get("times_at_dtype", {})) == ["bf16", "fp16"] for u in prof["units"]), "no 16-bit unit times"
cluster = json.load(open(os.path.join(ap, "cluster.json")))
assert "core_contention" not in cluster or "core_contention" in cluster["provenance"], "core_contention without provenance"
print("grid rounds ok:", {r["label"]: r["measured_time_rounds_s"] for r in f["rows"]})
PY
