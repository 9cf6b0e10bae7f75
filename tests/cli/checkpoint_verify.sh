#!/usr/bin/env bash
# Verified checkpoints (issue #37): a resume refuses, in one line with exit 1 and before it trains, a shard
# with a flipped byte, two shards swapped, a shard of another step (even under a manifest without
# checksums: each shard names its step and rank), and manifests with values out of range (shards 0,
# world_size 0, a unit without a count); an intact checkpoint still resumes. Another run's checkpoint (another
# seed or global batch: the data order) is refused in the launcher before any rank starts, and resumes with
# --resume-other-run; the manifest records the run's identity and the plan's SHA-1.
#   checkpoint_verify.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_workdir
export OMP_NUM_THREADS=1
gpt=(--model gpt --preset gpt2-tiny --global-batch 8 --set zero_stage=3 --threads 1)
"$zp" -q run --nproc 2 "${gpt[@]}" --steps 4 --checkpoint-dir ck --checkpoint-every 2 -o full.json || fail "the run"
grep -q '"sha1"' ck/step-4/manifest.json || fail "the manifest records no checksums"
"$zp" -q run "${gpt[@]}" --steps 1 --warmup 0 --resume ck -o ok.json || fail "an intact checkpoint does not resume"

expect_bad() {  # EXPECTED-TEXT FOLDER
  expect_one_line 1 "$1" "$zp" run "${gpt[@]}" --steps 1 --warmup 0 --resume "$2"
}
copy() { rm -rf "$1"; cp -r ck "$1"; }
edit() {  # FOLDER PYTHON-STATEMENT on the manifest m
  "$py" - "$1/step-4/manifest.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(m, open(sys.argv[1], "w"))
PY
}

copy flipped
"$py" - flipped/step-4/rank1.pt <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[len(b) // 2] ^= 0x40; open(sys.argv[1], "wb").write(b)
PY
expect_bad "rank1.pt is corrupted" flipped

copy swapped
mv swapped/step-4/rank0.pt swapped/step-4/tmp && mv swapped/step-4/rank1.pt swapped/step-4/rank0.pt && mv swapped/step-4/tmp swapped/step-4/rank1.pt
expect_bad "rank0.pt is corrupted" swapped

copy stale
cp stale/step-2/rank1.pt stale/step-4/rank1.pt
expect_bad "rank1.pt is corrupted" stale
edit stale "del m['files']"  # a manifest of before the checksums: the shard still names its step
expect_bad "rank1.pt holds step 2 rank 1, not step 4 rank 1" stale

copy shards0; edit shards0 "m['shards'] = 0"
expect_bad 'manifest.json "shards" 0 is not in 1..2' shards0
copy world0; edit world0 "m['world_size'] = 0"
expect_bad 'manifest.json "world_size" 0 is not in 1..1048576' world0
copy unit; edit unit "m['units'][1] = {'name': 'block[0]'}"
expect_bad "manifest.json has a unit without a name and a parameter count" unit

# Another run's checkpoint: refused before any rank starts (one line, exit 1), with the flag it resumes.
grep -q '"run"' ck/step-4/manifest.json && grep -q '"plan_sha1"' ck/step-4/manifest.json || fail "the manifest records no run identity"
other() {  # EXPECTED-TEXT ARGS...
  local want=$1; shift
  expect_one_line 1 "$want" "$zp" run --nproc 2 "$@" --steps 1 --warmup 0 --resume ck
}
other "it is another run's: its seed 0 != this run's 7 (resume it all the same with --resume-other-run)" \
  "${gpt[@]}" --set seed=7
other "its global_batch 8 != this run's 4" --model gpt --preset gpt2-tiny --global-batch 4 --set zero_stage=3 --threads 1
"$zp" -q run --nproc 2 "${gpt[@]}" --set seed=7 --steps 1 --warmup 0 --resume ck --resume-other-run -o other.json \
  || fail "--resume-other-run does not resume"
# The ranks check it too (an env-launched rank has no launcher to ask): the manifest's model edited.
copy renamed; edit renamed "m['run']['model'] = 'gpt2-other'"
expect_bad "it is another run's: its model \"gpt2-other\" != this run's" renamed
echo "checkpoint_verify: ok"
