#!/usr/bin/env bash
# README example: `profile --trace` writes a Chrome trace of the profiling run beside the profile:
# per unit and batch a forward and a backward span per timed repeat (compute track) and per memory
# pass (memory pass track), each with "memory device" counters at its start and end; the spans'
# durations are the profile's times. An --analytic profile has nothing to trace: one line, exit 1.
#   profile_trace.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_workdir
"$zp" profile --model mlp --batch 2 --batches 2 --repeats 1 --threads 1 --trace trace.json -o model.json \
  2>stderr.txt || { cat stderr.txt; fail "profile --trace"; }
grep -q "wrote trace.json" stderr.txt || fail "profile does not say it wrote the trace"
"$py" - <<'PY' || exit 1
import json
model = json.load(open("model.json"))
events = json.load(open("trace.json"))["traceEvents"]
errors = []
def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        errors.append(what)
names = [u["name"] for u in model["units"]]
threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
check(threads == {0: "compute", 1: "memory pass"}, f"threads compute and memory pass: {threads}")
process = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
check(process == ["zeroplan profile"], f"process name: {process}")
timed = [e for e in events if e["ph"] == "X" and e["tid"] == 0]
memory = [e for e in events if e["ph"] == "X" and e["tid"] == 1]
want = [f"{p} {n}" for n in names for p in ("forward", "backward")]
check(sorted(e["name"] for e in timed) == sorted(want), f"one timed forward and backward span per unit: {len(timed)}")
check(sorted(e["name"] for e in memory) == sorted(want), f"one memory-pass forward and backward span per unit: {len(memory)}")
check(all(e["args"]["unit_name"] == names[e["args"]["unit"]] and e["args"]["batch"] == 2 and e["args"]["repeat"] == 0
          for e in timed), "timed spans carry unit, unit_name, batch 2, repeat 0")
for u in model["units"]:
    for phase, key in (("forward", "time_fwd_s"), ("backward", "time_bwd_s")):
        span = next(e for e in timed if e["name"] == f"{phase} {u['name']}")
        check(abs(span["dur"] - u[key]["value"] * 1e6) <= 0.001,
              f"{phase} {u['name']}: span {span['dur']} us is the profile's {key} {u[key]['value'] * 1e6:.3f} us")
counters = [e for e in events if e["ph"] == "C"]
check(len(counters) == 2 * (len(timed) + len(memory)), f"two memory counters per span: {len(counters)}")
check(all(c["name"] == "memory device" and 0 <= c["args"]["bytes"] <= c["args"]["peak_bytes"] for c in counters),
      "counters are memory device with 0 <= bytes <= peak_bytes")
check(max(c["args"]["peak_bytes"] for c in counters) > 0, "some memory is counted")
ends = sorted((e["ts"], e["ts"] + e["dur"]) for e in timed + memory)
check(all(a[1] <= b[0] + 0.002 for a, b in zip(ends, ends[1:])), "spans run one at a time")
check("kernel_time_fwd_s" not in json.dumps(model), "no kernel times without CUPTI")
raise SystemExit(1 if errors else 0)
PY
# The same profile twice gives a trace of the same shape (event names and order).
"$zp" -q profile --model mlp --batch 2 --batches 2 --repeats 1 --threads 1 --trace again.json
"$py" -c '
import json, sys
a, b = (json.load(open(f))["traceEvents"] for f in ("trace.json", "again.json"))
shape = lambda t: [(e["ph"], e["name"], e.get("tid")) for e in t]
sys.exit(0 if shape(a) == shape(b) else "FAIL: two profiles give traces of different shapes")' || exit 1
echo "ok: the same profile twice gives the same trace shape"
set +e
"$zp" -q profile --analytic gpt --trace t.json 2>err.txt
rc=$?
set -e
[ "$rc" = 1 ] && [ "$(grep -c '' err.txt)" = 1 ] && grep -q -- "--trace: an --analytic profile runs nothing to trace" err.txt ||
  { cat err.txt; fail "profile --analytic --trace: exit $rc (want 1, one line)"; }
echo "ok: --analytic --trace: $(cat err.txt)"
[ ! -e t.json ] || fail "--analytic --trace wrote a trace"
# README example: under the run's conditions (2 local ranks computing each unit at once), recorded in the
# profile with the executor's backward (gradients added into a buffer).
"$zp" -q profile --model mlp --batch 2 --batches 2 --repeats 1 --threads 1 --concurrent-ranks 2 -o two.json
"$py" -c '
import json, sys
m = json.load(open("two.json"))
sys.exit(0 if m.get("concurrent_ranks") == 2 and m.get("backward_adds_grads") is True
         else "FAIL: concurrent_ranks / backward_adds_grads not recorded: %s" % {k: m.get(k) for k in ("concurrent_ranks", "backward_adds_grads")})' || exit 1
echo "ok: --concurrent-ranks 2 recorded"
