#!/usr/bin/env bash
# Failing commands end with ONE line on stderr naming what is wrong, a fixed exit code, and never a C++
# backtrace ("frame #"): a convolutional model fed the wrong shape, a file that is not TorchScript,
# BatchNorm at a batch it cannot normalise (in one process and on 2 ranks), a model name where a
# profile is wanted, what the executor does not run in 16 bits (LocalSGD with 16-bit parameters, AdaScale with
# loss scaling; in one process and on 2 ranks), a GPU probe without a GPU.
#   errors.sh ZEROPLAN PYTHON
set -uo pipefail
zp=$1; py=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
"$py" "$here/../profiles/zoo/make_scripted_cnn.py" "$out/cnn.pt" 10 || exit 1
echo "not a model" > "$out/bad.pt"
status=0
# expect CODE PATTERN ARGS...: exit code CODE, one stderr line matching the grep pattern PATTERN.
expect() {
  local code=$1 pattern=$2; shift 2
  "$zp" "$@" >"$out/stdout" 2>"$out/stderr"
  local rc=$? lines
  lines=$(grep -c '' "$out/stderr")
  if [ "$rc" != "$code" ] || [ "$lines" != 1 ] || grep -q 'frame #' "$out/stderr" || ! grep -Eq "$pattern" "$out/stderr"; then
    echo "FAIL: zeroplan $* -> exit $rc (want $code), $lines stderr line(s):"; sed 's/^/  | /' "$out/stderr"; status=1
  else
    echo "ok: exit $rc: $(cat "$out/stderr")"
  fi
}
expect 1 'child stem \(Sequential\) failed on input \[2, 4, 16, 16\]: .*(channels|Error)' \
  -q profile --torchscript "$out/cnn.pt" --input-shape 4,16,16 --task classify --classes 10
# probe --device cuda on a machine without a GPU; --base without --device cuda.
expect 1 'probe: device cuda: (no such CUDA device on this machine \(0 visible\)|this build has no CUDA)' \
  probe --device cuda -o "$out/gpu.json"
expect 1 'probe: probe --base applies to --device cuda' probe --base h100-sxm-80gb -o "$out/gpu.json"
expect 1 "torchscript $out/bad.pt: cannot load: " \
  -q profile --torchscript "$out/bad.pt" --input-shape 3,16,16
expect 1 'needs an output \[batch, 7\], got \[2, 10\]' \
  -q run --torchscript "$out/cnn.pt" --input-shape 3,16,16 --task classify --classes 7 --steps 2
# resnet at 32 x 32 has 1 x 1 maps in layer4: BatchNorm cannot normalise one sample there.
expect 3 'unit layer4, phase forward \(micro batch 1\): torch: .*more than 1 value per channel' \
  -q run --model resnet --preset resnet-tiny --opt image=32 --global-batch 1 --steps 2 --warmup 1
expect 3 'rank [01] exited with code 3( at step 0)?: unit layer4, phase forward \(micro batch 1\): torch: ' \
  -q run --nproc 2 --model resnet --preset resnet-tiny --opt image=32 --global-batch 2 --steps 2 --warmup 1
expect 1 'profile: unit layer4 at batch 1 failed: torch: .*more than 1 value per channel' \
  -q profile --model resnet --preset resnet-tiny --opt image=32 --batch 1 --batches 1 --repeats 1
expect 1 'no file "gpt": this wants a ModelProfile .*zeroplan profile --model gpt' \
  -q simulate --model gpt --cluster a100-sxm-80gb
printf '{"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 1e999}' > "$out/overflow.json"
expect 1 "overflow.json: number overflow parsing '1e999' \(the value of \"global_batch\"\)" \
  -q simulate --model "$out/overflow.json" --cluster a100-sxm-80gb
# An output that cannot be written is refused before the run trains (one line, no run summary).
expect 1 "/proc/zeroplan-x.json: cannot write: " -q run --model gpt --preset gpt2-tiny --steps 2 -o /proc/zeroplan-x.json
expect 1 "^zeroplan: --trace: /nonexistent/t.json: cannot write: no folder /nonexistent" \
  -q run --nproc 2 --model mlp --steps 2 --trace /nonexistent/t.json
"$zp" -q profile --analytic gpt --preset gpt2-tiny -o "$out/gpt.json" || exit 1
expect 1 "^zeroplan: --output-dir: /proc/zeroplan-x: cannot write: " \
  -q tune --model "$out/gpt.json" --cluster a100-sxm-80gb --global-batch 8 -o /proc/zeroplan-x
expect 1 "tune: --fix zero_stage=7: zero_stage must be 0, 1, 2 or 3 \(got 7\)" \
  -q tune --model "$out/gpt.json" --cluster a100-sxm-80gb --global-batch 8 --fix zero_stage=7
for o in "--top-k 0" "--top-k -1" "--nodes 0"; do
  expect 1 "^zeroplan: ${o% *}: must be >= 1 \(got ${o#* }\)" -q tune --model "$out/gpt.json" --cluster a100-sxm-80gb --global-batch 8 $o
done
# The device before any rank or profile: unknown (1), or a GPU this machine or build lacks (2, not possible here).
expect 1 "^zeroplan run: --device tpu: expected cpu, cuda or cuda:<i>" -q run --nproc 2 --model mlp --steps 2 --device tpu
expect 2 "^zeroplan run: --device cuda: (no CUDA device is visible|this build of zeroplan has no CUDA)" \
  -q run --nproc 2 --model mlp --steps 2 --device cuda
expect 2 "^zeroplan profile: --device cuda: (no CUDA device is visible|this build of zeroplan has no CUDA)" \
  -q profile --model mlp --device cuda
expect 1 "^zeroplan: --input-shape requires --torchscript" -q profile --model mlp --input-shape 3,32,32
expect 1 "^zeroplan run: model gpt: option layers must be an integer >= 1, got \"0\"" \
  -q run --nproc 2 --model gpt --preset gpt2-tiny --opt layers=0 --steps 2
expect 1 "^zeroplan: --warmup: must be >= 0 \(got -1\)" -q run --nproc 2 --model mlp --steps 2 --warmup -1
expect 1 "^zeroplan: --device-memory-limit: must be >= 0 \(got -1\)" -q run --nproc 2 --model mlp --steps 2 --device-memory-limit -1
expect 1 "^zeroplan: --threads: must be 0 \(all cores\) to [0-9]+ .*got 100000" -q profile --model mlp --threads 100000
# A diverged run is a failure (exit 3, the step named), and writes no checkpoint of the diverged model.
expect 3 "^zeroplan run: rank [01] exited with code 3: the run diverged at step 1: loss -?nan" \
  -q run --model mlp --nproc 2 --steps 4 --set optimizer.lr=1e30 --checkpoint-dir "$out/diverged" --checkpoint-every 1
if ls "$out/diverged" | grep -q 'step-[2-9]'; then echo "FAIL: a checkpoint after the divergence: $(ls "$out/diverged")"; status=1; fi
# autopilot checks its options and its cluster file before it profiles anything.
echo '{corrupt' > "$out/corrupt.json"
expect 1 "^zeroplan: --budget-fraction: must be > 0 \(got -1\)" -q autopilot --budget-fraction -1 -o "$out/ap1"
expect 1 "^zeroplan: --headroom: must be <= 0.99 \(got 1.5\)" -q autopilot --headroom 1.5 -o "$out/ap3"
expect 1 "^zeroplan autopilot: .*corrupt.json:1:2: invalid JSON" -q autopilot --cluster "$out/corrupt.json" -o "$out/ap2"
expect 1 "unknown model \"foo\" \(models: gpt, mlp, resnet\)" -q run --model foo --nproc 2 --steps 2
# Option values out of range: one line naming the option and the value, exit 1, before any work.
expect 1 '^zeroplan: --threads: must be 0 \(all cores\) to [0-9]+ .*got -1' -q run --model mlp --threads -1 --steps 2
expect 1 '^zeroplan: --nproc: must be > 0 \(got 0\)' -q run --model mlp --nproc 0 --steps 2
expect 1 '^zeroplan: --timeout: must be >= 2 \(got 0\)' -q run --nproc 2 --model mlp --timeout 0 --steps 2
expect 1 '^zeroplan: --timeout: must be >= 2 \(got 0.001\)' -q run --nproc 2 --model mlp --timeout 0.001 --steps 2
# Another model's profile for a pipeline's balance (as many units as gpt2-tiny): refused before any rank.
"$zp" -q profile --model mlp -o "$out/mlp-profile.json"
expect 1 "^zeroplan run: --profile $out/mlp-profile.json: a profile of zoo:mlp, not of this run's model zoo:gpt/gpt2-tiny\$" \
  -q run --nproc 2 --model gpt --preset gpt2-tiny --global-batch 8 --steps 2 --set pipeline_stages=2 --profile "$out/mlp-profile.json"
expect 1 '^zeroplan: --world-size: must be >= 1 \(got 0\)' -q tune --model "$out/cnn.pt" --cluster a100-sxm-80gb --global-batch 8 --world-size 0
for v in 0 -1 nan 1e308; do
  expect 1 "^zeroplan: --device-memory-gib: must be .*\(got $v\)" -q tune --model "$out/cnn.pt" --cluster a100-sxm-80gb --global-batch 8 --device-memory-gib $v
done
expect 1 "^zeroplan: --output: is an empty path" -q simulate --model "$out/cnn.pt" --cluster a100-sxm-80gb -o ''
# What the executor does not run in 16 bits: LocalSGD/SlowMo with 16-bit parameters (ReplicaSync averages
# the compute copy, not the master), AdaScale with loss scaling (its gain would read scaled gradients).
expect 1 '^zeroplan run: precision.param_dtype bf16 with localsgd_frequency 2: the executor runs LocalSGD and SlowMo with fp32 parameters only$' \
  -q run --model gpt --preset gpt2-tiny --steps 2 --set precision.param_dtype=bf16 --set precision.compute_dtype=bf16 \
  --set localsgd_frequency=2
expect 1 '^zeroplan run: adascale with precision.loss_scale: the executor runs AdaScale without loss scaling only$' \
  -q run --model gpt --preset gpt2-tiny --steps 2 --set precision.compute_dtype=fp16 --set precision.loss_scale=dynamic \
  --set optimizer.name=sgd --set adascale=true
expect 1 '^zeroplan run: adascale with precision.loss_scale: the executor runs AdaScale without loss scaling only$' \
  -q run --nproc 2 --model gpt --preset gpt2-tiny --steps 2 --set precision.compute_dtype=fp16 \
  --set precision.loss_scale=dynamic --set optimizer.name=sgd --set adascale=true
# The exit codes: `zeroplan --help` lists them from the one table the CLI maps errors with (cli/src/app.cpp);
# docs/2-subcommands.md's table has a row for each, with the same name.
docs="$here/../../docs/2-subcommands.md"
list=$("$zp" --help | sed -n 's/^Exit codes: \(.*\)\.$/\1/p')
[ -n "$list" ] || { echo "FAIL: zeroplan --help lists no exit codes"; status=1; }
IFS=',' read -ra rows <<<"$list"
for row in "${rows[@]}"; do
  row=${row# }
  code=${row%% *}; name=${row#* }
  if grep -q "^| $code | $name" "$docs"; then echo "ok: exit code $code ($name) in the docs' table"
  else echo "FAIL: exit code $code ($name) has no row \"| $code | $name\" in docs/2-subcommands.md"; status=1; fi
done
exit $status
