#!/usr/bin/env bash
# Mixed precision tracks full precision: 50 steps of gpt2-tiny on 2 Gloo ranks in fp32, bf16 and fp16
# (dynamic loss scale) with zeroplan, and the same model in PyTorch (bench/pytorch_baselines.py, one
# process, the same global batch) in fp32 and under torch.autocast bf16 / fp16 + GradScaler.
#   - each 16-bit run within RTOL of its own fp32 run at every step (zeroplan and PyTorch alike);
#   - zeroplan's 16-bit runs against PyTorch's: the mean loss over the last 10 steps within TASK_TOL
#     (the two draw their Markov chain, samples and initial weights with different generators).
#   precision_losses.sh ZEROPLAN PYTHON [RTOL=0.002] [TASK_TOL=0.05]
set -euo pipefail
zp=$1; py=$2; rtol=${3:-0.002}; task_tol=${4:-0.05}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
for d in fp32 bf16 fp16; do
  sets=()
  if [ "$d" != fp32 ]; then
    scale=none; [ "$d" = fp16 ] && scale=dynamic
    sets=(--set "precision.param_dtype=$d" --set "precision.compute_dtype=$d" --set "precision.reduce_dtype=$d"
          --set "precision.loss_scale=$scale")
  fi
  "$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --global-batch 16 --steps 50 --warmup 1 "${sets[@]}" \
      -o "$out/zeroplan_$d.json"
  "$py" "$root/bench/pytorch_baselines.py" --layers 2 --hidden 64 --heads 2 --seq 32 --vocab 256 --micro-batch 16 \
      --steps 50 --warmup 1 --threads 1 --precision "$d" -o "$out/pytorch_$d.json" 2>/dev/null
done
python3 - "$out" "$rtol" "$task_tol" <<'PY'
import json, os, sys
out, rtol, task_tol = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
losses = {(s, d): json.load(open(os.path.join(out, f"{s}_{d}.json")))["losses"]
          for s in ("zeroplan", "pytorch") for d in ("fp32", "bf16", "fp16")}
bad = False
print(f"{'run':<18} {'step 1':>8} {'step 25':>8} {'step 50':>8} {'last 10':>8} {'vs own fp32 (max over steps)':>30}")
for (s, d), l in losses.items():
    ref = losses[(s, "fp32")]
    assert len(l) == 50, f"{s} {d}: {len(l)} losses"
    dev = max(abs(a - b) / b for a, b in zip(l, ref))
    ok = dev <= rtol
    bad |= not ok
    print(f"{s + ' ' + d:<18} {l[0]:8.4f} {l[24]:8.4f} {l[49]:8.4f} {sum(l[-10:]) / 10:8.4f} {100 * dev:29.4f}% "
          f"{'ok' if ok else 'FAIL'}")
for d in ("bf16", "fp16"):
    z, p = sum(losses[("zeroplan", d)][-10:]), sum(losses[("pytorch", d)][-10:])
    ok = abs(z - p) / p <= task_tol
    bad |= not ok
    print(f"zeroplan {d} vs PyTorch autocast {d}: last-10 mean {z / 10:.4f} vs {p / 10:.4f} "
          f"({100 * (z - p) / p:+.2f}%) {'ok' if ok else 'FAIL'}")
sys.exit(1 if bad else 0)
PY
