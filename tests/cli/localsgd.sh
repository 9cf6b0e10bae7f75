#!/usr/bin/env bash
# LocalSGD, SlowMo and AdaScale through `zeroplan run` (the README's commands):
#   SlowMo with one rank per node runs and records its plan; AdaScale records a gain per step in [1, 2];
#   4 ranks, LocalSGD every 3 steps: on one node of 4 (--ranks-per-node 4) it is DDP bit for bit, on two
#   nodes of 2 (node groups formed over Gloo) the first step's loss is DDP's and later ones are not;
#   --ranks-per-node that does not divide the ranks is one line, exit 1; `compare --baseline` shows the
#   two-node LocalSGD run's loss beside DDP's (the price), and refuses a synchronous run as the measured one;
#   `autopilot --allow-approximate-averaging` runs both and its report shows both losses.
#   localsgd.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_workdir
export OMP_NUM_THREADS=1
sgd=(--set optimizer.name=sgd --set optimizer.lr=0.05)
"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --ranks-per-node 1 --set localsgd_frequency=4 \
  --set localsgd_warmup_steps=2 --set slowmo_frequency=4 --set slowmo_momentum=0.5 "${sgd[@]}" --steps 10 \
  -o slowmo.json || fail "slowmo run"
"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --set adascale=true "${sgd[@]}" --steps 10 -o adascale.json ||
  fail "adascale run"
four=(--nproc 4 --model gpt --preset gpt2-tiny --global-batch 8 --threads 1 --steps 6 "${sgd[@]}")
"$zp" -q run "${four[@]}" -o ddp4.json || fail "ddp 4 ranks"
"$zp" -q run "${four[@]}" --set localsgd_frequency=3 --ranks-per-node 4 -o onenode.json || fail "one node"
"$zp" -q run "${four[@]}" --set localsgd_frequency=3 --ranks-per-node 2 -o twonodes.json || fail "two nodes"
set +e
msg=$("$zp" run "${four[@]}" --set localsgd_frequency=3 --ranks-per-node 3 2>&1); code=$?
set -e
echo "$msg"
[ "$code" -eq 1 ] || fail "--ranks-per-node 3 of 4 ranks: exit $code, expected 1"
[ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] || fail "--ranks-per-node 3: more than one line"
case "$msg" in *"--ranks-per-node 3 does not divide the 4 ranks"*) ;; *) fail "message: $msg" ;; esac
"$py" -c 'import json,sys; json.dump(json.load(open("twonodes.json"))["plan"], open("plan.json", "w"))'
"$zp" -q profile --analytic gpt --layers 2 --hidden 64 --heads 2 --seq 64 --vocab 512 --batch 2 -o prof.json
"$zp" -q simulate --model prof.json --cluster a100-sxm-80gb --plan plan.json -o pred.json
"$zp" compare --predicted pred.json --measured twonodes.json --baseline ddp4.json -o price.json 2>compare.txt ||
  fail "compare --baseline"
cat compare.txt
grep -q "what the speed costs (LocalSGD every 3 steps against the synchronous run ddp4.json)" compare.txt ||
  fail "compare prints no price line"
set +e
msg=$("$zp" -q compare --predicted pred.json --measured ddp4.json --baseline ddp4.json 2>&1); code=$?
set -e
[ "$code" -eq 1 ] && [ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] || fail "synchronous measured run: exit $code: $msg"
case "$msg" in *"the measured run is synchronous"*) ;; *) fail "message: $msg" ;; esac
# autopilot --allow-approximate-averaging: the default plan and the same with LocalSGD (one rank per node)
# run side by side, and the report shows both losses after the same steps.
suite_cluster_args
"$zp" -q autopilot --model mlp --preset mlp-tiny --allow-approximate-averaging --verify 1 --steps 8 --warmup 1 \
  "${cluster[@]}" -o ap || fail "autopilot --allow-approximate-averaging"
grep -q "^## What the speed costs" ap/report.md || fail "the autopilot report has no price section"
"$py" - <<'PY'
import json, math, sys
errors = []
def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        errors.append(what)
slowmo = json.load(open("slowmo.json"))
p = slowmo["plan"]
check((p["localsgd_frequency"], p["localsgd_warmup_steps"], p["slowmo_frequency"], p["slowmo_momentum"]) == (4, 2, 4, 0.5),
      "the SlowMo record holds its plan")
check(len(slowmo["losses"]) == 10 and all(math.isfinite(x) for x in slowmo["losses"]), "SlowMo losses finite")
gains = json.load(open("adascale.json")).get("lr_gains", [])
check(len(gains) == 10 and all(1 - 1e-9 <= g <= 2 + 1e-9 for g in gains), f"AdaScale gains in [1, 2]: {gains}")
ddp, one, two = (json.load(open(f))["losses"] for f in ("ddp4.json", "onenode.json", "twonodes.json"))
check(one == ddp, "LocalSGD on one node of 4 ranks is DDP bit for bit")
check(two[0] == ddp[0], "two nodes: the first step's loss is DDP's")
check(two[1:] != ddp[1:], "two nodes: later losses differ from DDP's (nodes step apart)")
sync_run = json.load(open("ap/price/synchronous/run_record.json"))
local_run = json.load(open("ap/price/localsgd/run_record.json"))
check(local_run["plan"]["localsgd_frequency"] == 4 and sync_run["plan"]["localsgd_frequency"] in (0, 1),
      "autopilot ran a LocalSGD plan and a synchronous one")
check(local_run["losses"][0] == sync_run["losses"][0] and local_run["losses"][1:] != sync_run["losses"][1:],
      "one rank per node: the LocalSGD run steps apart from DDP after the first step")
report = open("ap/report.md").read()
mean2 = lambda l: sum(l[-2:]) / 2  # 8 steps: the last quarter
check(f"| synchronous (DDP) | {mean2(sync_run['losses']):.4f} |" in report and
      f"| LocalSGD every 4 steps | {mean2(local_run['losses']):.4f} |" in report,
      "the report's price table holds both runs' losses after the same 8 steps")
price = json.load(open("price.json"))["price"]
tail = lambda l: sum(l[-1:]) / 1  # 6 steps: the last quarter is the last step
check(price["steps"] == 6 and price["loss"] == tail(two) and price["baseline_loss"] == tail(ddp),
      f"the price holds both losses after the same 6 steps: {price}")
sys.exit(1 if errors else 0)
PY
