#!/usr/bin/env bash
# LocalSGD, SlowMo and AdaScale through `zeroplan run` (the README's commands):
#   SlowMo with one rank per node runs and records its plan; AdaScale records a gain per step in [1, 2];
#   4 ranks, LocalSGD every 3 steps: on one node of 4 (--ranks-per-node 4) it is DDP bit for bit, on two
#   nodes of 2 (node groups formed over Gloo) the first step's loss is DDP's and later ones are not;
#   --ranks-per-node that does not divide the ranks is one line, exit 1.
#   localsgd.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$out"
fail() { echo "FAIL: $*"; exit 1; }
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
sys.exit(1 if errors else 0)
PY
