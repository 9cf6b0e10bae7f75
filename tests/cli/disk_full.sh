#!/usr/bin/env bash
# A full disk during a checkpoint save (issue #37): the checkpoint folder is a small tmpfs filled up after
# the first checkpoint (a real ENOSPC from the kernel, in a private mount namespace). The save that
# fails is one line and exit 3, leaves no temporary shard, and the earlier checkpoint resumes: its losses
# are an uninterrupted run's bit for bit.
#   disk_full.sh ZEROPLAN PYTHON
set -euo pipefail
zp=$1; py=$2
if [ -z "${ZEROPLAN_IN_MOUNT_NS:-}" ]; then
  # A mount namespace of its own, so the tmpfs goes with this script (as root, or as a user through a
  # user namespace).
  for ns in "unshare -m" "unshare -rm"; do
    if $ns true 2>/dev/null; then ZEROPLAN_IN_MOUNT_NS=1 exec $ns "$0" "$@"; fi
  done
  echo "SKIP: no mount namespace here (unshare -m and unshare -rm both refused)"; exit 77
fi
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_workdir 'umount "$out/fs" 2>/dev/null || true'
export OMP_NUM_THREADS=1
mkdir fs && mount -t tmpfs -o size=8m tmpfs fs
gpt=(--model gpt --preset gpt2-tiny --global-batch 8 --set zero_stage=3 --threads 1)

"$zp" -q run --nproc 2 "${gpt[@]}" --steps 4 -o full.json || fail "uninterrupted run"
"$zp" -q run --nproc 2 "${gpt[@]}" --steps 2 --checkpoint-dir fs/ck --checkpoint-every 2 || fail "first checkpoint"
[ -f fs/ck/step-2/manifest.json ] || fail "step 2 has no manifest"
dd if=/dev/zero of=fs/filler bs=64k 2>/dev/null || true   # the disk is full now
set +e
"$zp" -q run --nproc 2 "${gpt[@]}" --steps 2 --resume fs/ck --checkpoint-dir fs/ck --checkpoint-every 2 2>full.txt
code=$?
set -e
cat full.txt
[ "$code" -eq 3 ] || fail "a save on a full disk: exit $code, expected 3"
[ "$(wc -l <full.txt)" -eq 1 ] || fail "a save on a full disk printed $(wc -l <full.txt) lines, expected 1"
grep -q "checkpoint: cannot write fs/ck/step-4/rank[01].pt: No space left on device" full.txt || fail "the line names no file or cause"
tmp=$(find fs/ck -name '*.tmp*' | tr '\n' ' ')
[ -z "$tmp" ] || fail "temporary shards left: $tmp"
[ ! -e fs/ck/step-4/manifest.json ] || fail "step 4 has a manifest"
rm fs/filler
"$zp" -q run --nproc 2 "${gpt[@]}" --steps 2 --resume fs/ck -o resumed.json || fail "resume after the full disk"
"$py" - <<'PY' || fail "resumed losses differ from the uninterrupted run's steps 2-3"
import json
a = json.load(open("resumed.json"))["losses"]; b = json.load(open("full.json"))["losses"][2:4]
print("resumed", a, "uninterrupted", b)
raise SystemExit(0 if a == b else 1)
PY
echo "disk_full: OK"
