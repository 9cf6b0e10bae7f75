#!/usr/bin/env bash
# Checkpoint and resume through `zeroplan run` (the README's commands):
#   kill-safe: a rank killed in the middle of saving step 4 (fault injection) ends the run with exit 3 and
#   leaves step 4 without a manifest; --resume then starts from step 2, and its losses are an
#   uninterrupted run's steps 2-3 bit for bit (stage 3, 2 ranks);
#   the README's pair: 2 ranks at stage 3 checkpoint every 5 steps, one rank resumes at step 10 with 2
#   microbatches (the same samples), its losses those of 15 uninterrupted steps on 2 ranks;
#   one line, exit 1: --resume of a folder without a checkpoint, --checkpoint-every without a folder,
#   checkpoints with LocalSGD, a checkpoint of another model.
#   checkpoint.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_workdir
export OMP_NUM_THREADS=1
gpt=(--model gpt --preset gpt2-tiny --global-batch 8 --set zero_stage=3 --threads 1)
same_losses() {  # A FROM B: losses of A equal B's from index FROM on, as many as A has
  "$py" - "$@" <<'PY' || fail "losses of $1 differ from $3's from step $2"
import json, sys
a = json.load(open(sys.argv[1]))["losses"]; b = json.load(open(sys.argv[3]))["losses"]; k = int(sys.argv[2])
print(sys.argv[1], a); print(sys.argv[3], b[k:k + len(a)])
sys.exit(0 if a == b[k:k + len(a)] else 1)
PY
}

"$zp" -q run --nproc 2 "${gpt[@]}" --steps 5 -o full.json || fail "uninterrupted run"
set +e
ZEROPLAN_FAULT_KILL_IN_SAVE=4 "$zp" -q run --nproc 2 "${gpt[@]}" --steps 4 --checkpoint-dir ck --checkpoint-every 2 \
  2>killed.txt
code=$?
set -e
cat killed.txt
[ "$code" -eq 3 ] || fail "a rank killed while saving: exit $code, expected 3"
[ -f ck/step-2/manifest.json ] || fail "step 2 has no manifest"
[ ! -e ck/step-4/manifest.json ] || fail "step 4 has a manifest though a rank died saving it"
"$zp" -q run --nproc 2 "${gpt[@]}" --steps 2 --resume ck -o resumed.json || fail "resume from step 2"
same_losses resumed.json 2 full.json

# Retention: --checkpoint-keep 2 keeps the newest two checkpoints, and what interrupted saves left (step 4
# of the killed run above, a stray step-1 folder without a manifest) is removed at the start.
mkdir -p ck/step-1 && touch ck/step-1/rank0.pt
"$zp" -q run --nproc 2 "${gpt[@]}" --steps 3 --resume ck --checkpoint-dir ck --checkpoint-every 1 --checkpoint-keep 2 \
  -o kept.json || fail "resume with --checkpoint-keep 2"
left=$(cd ck && ls -d step-* | sort -V | tr '\n' ' ')
[ "$left" = "step-4 step-5 " ] || fail "--checkpoint-keep 2 left: $left (expected step-4 step-5)"
[ -f ck/step-4/manifest.json ] && [ -f ck/step-5/manifest.json ] || fail "the kept checkpoints have no manifest"
same_losses kept.json 2 full.json
set +e
"$zp" -q run --nproc 2 "${gpt[@]}" --steps 2 --checkpoint-keep 2 2>keep.txt; code=$?
set -e
[ "$code" -eq 1 ] && grep -q "checkpoint-keep 2 needs --checkpoint-dir" keep.txt || fail "--checkpoint-keep without a folder: exit $code, $(cat keep.txt)"

# The README's commands: 2 ranks -> 1 rank.
"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --global-batch 8 --set zero_stage=3 --steps 15 -o full15.json || fail "15 steps"
"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --global-batch 8 --set zero_stage=3 --steps 10 \
    --checkpoint-dir ckpt --checkpoint-every 5 -o run-first.json || fail "README: first run"
[ -f ckpt/step-5/manifest.json ] && [ -f ckpt/step-10/manifest.json ] || fail "checkpoints 5 and 10 missing"
"$zp" -q run --model gpt --preset gpt2-tiny --global-batch 8 --set zero_stage=3 --set microbatches=2 \
    --steps 5 --resume ckpt -o run-resumed.json || fail "README: resumed on one rank"
same_losses run-resumed.json 10 full15.json

# One line, exit 1.
expect_bad() { local want=$1; shift; expect_one_line 1 "$want" "$@"; }
mkdir empty
expect_bad "--resume empty: no checkpoint there" "$zp" run "${gpt[@]}" --steps 2 --resume empty
expect_bad "--checkpoint-every 2 needs --checkpoint-dir" "$zp" run "${gpt[@]}" --steps 2 --checkpoint-every 2
expect_bad "checkpoints: localsgd_frequency 2" "$zp" run --model gpt --preset gpt2-tiny --steps 2 \
  --set localsgd_frequency=2 --checkpoint-dir ck2
expect_bad "the checkpoint's unit count 4 != this run's 5" "$zp" run --model gpt --preset gpt2-tiny --opt layers=3 --global-batch 8 \
  --set zero_stage=3 --steps 2 --resume ckpt
echo "checkpoint: ok"
