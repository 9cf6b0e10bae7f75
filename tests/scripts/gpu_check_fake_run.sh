#!/usr/bin/env bash
# scripts/gpu-check.sh's real path (not the dry run) on stand-ins: a Python that reports a CUDA torch and
# a device, nvidia-smi naming an H100, nvcc, cmake (its configure leaves stand-in CUDA test binaries),
# and a zeroplan that only writes the documents the kit reads. Checks the kit runs every step in order,
# simulates against the GPU's shipped cluster extended with this host's probe and nvidia-smi's memory,
# records the GPU and torch version, writes the predicted-against-measured table, and that a failing
# step ends it with exit 2 naming the step, stops that plan (its row says "not run") and the next plans
# still run; a skipped CUDA test fails; --quick builds three targets with fewer steps; --deadline-s
# skips what is left (exit 4) and still writes the table; --bundle copies the results into a folder.
#   gpu_check_fake_run.sh SCRIPT
set -euo pipefail
kit=$1
tmp=${FAKE_TMP:-$(mktemp -d)}; [ -n "${FAKE_TMP:-}" ] || trap "rm -rf \"$tmp\"" EXIT
fail() { echo "FAIL: $*" >&2; for f in "$tmp"/out*/log.txt; do echo "--- $f"; cat "$f"; done; exit 1; }
mkdir -p "$tmp/bin"
real_python=$(command -v python3)
cat >"$tmp/bin/python" <<PY
#!/usr/bin/env bash
# Stands in for a Python with a CUDA torch 9.9.9 and a visible device; anything else goes to python3.
if [ "\${1:-}" = -c ] || { [ "\${1:-}" = -W ] && [ "\${3:-}" = -c ]; }; then
  code=\${!#}
  case "\$code" in
    *torch.__version__*torch.version.cuda*torch.cuda.is_available*) echo "9.9.9+cu999 99.9 1"; exit 0 ;;
    *torch.__version__*) echo "9.9.9+cu999"; exit 0 ;;
    *torch.version.cuda*) echo "99.9"; exit 0 ;;
    *torch*) exit 0 ;;
  esac
fi
exec $real_python "\$@"
PY
cat >"$tmp/bin/nvidia-smi" <<'SH'
#!/usr/bin/env bash
echo "NVIDIA H100 80GB HBM3, 999.99, 81559 MiB"
SH
cat >"$tmp/bin/cmake" <<'SH'
#!/usr/bin/env bash
# configure: make the build folder, a stand-in zeroplan and the two CUDA test binaries; --build: records
# its arguments (and sleeps ZP_BUILD_SLEEP seconds).
if [ "$1" = --build ]; then echo "$*" >>"$2/build-args"; sleep "${ZP_BUILD_SLEEP:-0}"; exit 0; fi
while (($#)); do [ "$1" = -B ] && build=$2; shift; done
mkdir -p "$build/tests/exec" "$build/tests/profiles" && cp "$ZP_STUB" "$build/zeroplan" && chmod +x "$build/zeroplan"
for t in exec/exec_cuda_test profiles/profiler_test; do
  printf '#!/usr/bin/env bash\necho "[ RUN      ] X.Y_CUDA"\n%s\necho "[  PASSED  ] 2 tests."\n' \
    "${ZP_SKIP:+echo \"[  SKIPPED ] X.Y_CUDA\"}" >"$build/tests/$t"
  chmod +x "$build/tests/$t"
done
SH
printf '#!/usr/bin/env bash\nexit 0\n' >"$tmp/bin/nvcc"
cat >"$tmp/zeroplan" <<'SH'
#!/usr/bin/env bash
# Writes what each subcommand's -o would hold, just enough for the kit's table.
cmd=$1; out=""; all="$*"
while (($#)); do [ "$1" = -o ] && out=$2; shift; done
[ -n "${ZP_FAIL:-}" ] && [[ "$all" == *"$ZP_FAIL"* ]] && [ "$cmd" = run ] && exit 3
case "$cmd" in
  simulate) cluster=$(sed -n 's/.*--cluster \([^ ]*\).*/\1/p' <<<"$all")
            if [ -n "${ZP_FAIL_GPU_PROBE:-}" ]; then   # the fallback: the shipped file, this host, nvidia-smi's memory
              grep -q '"extends": "h100-sxm-80gb"' "$cluster" || exit 1
              grep -q '"mem_bytes": 85520809984' "$cluster" || exit 1   # 81559 MiB
              grep -q '"memcpy_bw_bytes_per_s": 7000000000.0' "$cluster" || exit 1
            else
              grep -q '"probed over": "h100-sxm-80gb"' "$cluster" || exit 1
            fi
            echo '{"step_time_s": 0.1, "device": {"peak_bytes": 2147483648},
                   "host": {"peak_bytes": 1073741824, "allocator_overhead_bytes": 536870912}}' >"$out" ;;
  probe) if [[ "$all" == *"--device cuda --base h100-sxm-80gb"* ]]; then
           [ -n "${ZP_FAIL_GPU_PROBE:-}" ] && exit 3
           echo '{"probed over": "h100-sxm-80gb", "name": "h100-sxm-80gb-here",
                  "device": {"mem_bw_achieved_bytes_per_s": 3.0e12, "launch_overhead_s": 5e-6,
                             "gemm": {"efficiency": {"bf16": [{"m_min": 0, "n_min": 0, "k_min": 0, "efficiency": 0.8}]}}},
                  "host": {"bw_h2d_pinned_bytes_per_s": 5.0e10},
                  "provenance": {"device.mem_bw_achieved_bytes_per_s": {"source": "probe", "citation": "x"},
                                 "device.gemm.efficiency": {"source": "probe", "citation": "the buckets ...: bf16: 512 100.0 TFLOP/s"}}}' >"$out"; exit 0
         fi
         [[ "$all" == *"--no-collectives"* ]] || exit 1
         echo '{"host": {"mem_bytes": 1, "cores": 16, "memcpy_bw_bytes_per_s": 7e9, "optimizer": {}},
                "provenance": {"host.cores": {"source": "probe", "citation": "x"}}}' >"$out" ;;
  compare) echo '{"metrics": [{"name": "step_time_s", "measured": 0.125, "rel_error": -0.2},
                               {"name": "device_peak_bytes.rank0", "measured": 3221225472},
                               {"name": "host_reserved_bytes.rank0", "measured": 2147483648}], "verdict": "fail"}' >"$out" ;;
  *) echo '{}' >"$out" ;;
esac
SH
chmod +x "$tmp/bin/python" "$tmp/bin/nvidia-smi" "$tmp/bin/cmake" "$tmp/bin/nvcc" "$tmp/zeroplan"
export ZP_STUB="$tmp/zeroplan"
export PATH="$tmp/bin:$PATH"

ZEROPLAN_COMMIT=0123abcd "$kit" --python "$tmp/bin/python" --out "$tmp/out" --build-dir "$tmp/build" --jobs 2 >"$tmp/stdout" 2>&1 ||
  fail "the run exited $? ($(tail -3 "$tmp/stdout"))"
grep -q '^zeroplan_commit 0123abcd$' "$tmp/out/versions.txt" || fail "versions.txt does not name ZEROPLAN_COMMIT's commit"
grep -q '^torch 9.9.9+cu999$' "$tmp/out/versions.txt" || fail "versions.txt has no torch line"
grep -q '^gpu NVIDIA H100 80GB HBM3' "$tmp/out/versions.txt" || fail "versions.txt has no GPU line"
for s in configure build cuda-tests profile-gpt2-small profile-resnet50 probe-gpu simulate-s0 run-s0 compare-s0 \
         simulate-s1-offload-ckpt run-s1-offload-ckpt compare-s1-offload-ckpt run-s0-act0.5 run-om2; do
  grep -q "step $s: ok" "$tmp/out/log.txt" || fail "step $s did not pass"
done
grep -q 'step build: .*--target' "$tmp/out/log.txt" && fail "a full run built only some targets"
grep -q '^Measured on NVIDIA H100 80GB HBM3, 999.99, 81559 MiB with torch 9.9.9+cu999' "$tmp/out/summary.md" ||
  fail "summary.md has no heading with the GPU and torch"
grep -qF '| s1-offload | 100.0 | 125.0 | -20.0% | 2.00 | 3.00 | 1.50 | 2.00 | fail |' "$tmp/out/summary.md" || fail "summary row: $(cat "$tmp/out/summary.md")"
[ "$(grep -c '^| \(s\|om\)' "$tmp/out/summary.md")" = 9 ] || fail "summary.md has not 9 plan rows"

# A failing step: exit 2, named; the later steps still run.
set +e
ZP_FAIL="checkpointing=all --steps" "$kit" --python "$tmp/bin/python" --out "$tmp/out2" --build-dir "$tmp/build2" >"$tmp/stdout2" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "a failing run step exited $rc, not 2"
grep -q "failed steps: run-s0-ckpt run-s1-offload-ckpt" "$tmp/stdout2" || fail "the failed steps are not named: $(tail -2 "$tmp/stdout2")"
grep -q "step compare-s0-ckpt" "$tmp/out2/log.txt" && fail "a plan whose run failed was compared"
grep -q "plan s0-ckpt: stopped at its failed step" "$tmp/out2/log.txt" || fail "the stopped plan is not named"
grep -q "step simulate-s1-offload-ckpt: ok" "$tmp/out2/log.txt" || fail "the next plan did not run after a failure"
grep -qF '| s0-ckpt | | | | | | | | not run |' "$tmp/out2/summary.md" || fail "a plan whose run failed: $(cat "$tmp/out2/summary.md")"

grep -q "step probe-host" "$tmp/out/log.txt" && fail "the host probe ran although the GPU probe passed"
grep -qF '| device copy, read + write | 3.00 TB/s |' "$tmp/out/summary.md" || fail "summary.md has no probed device table"
grep -qF '| GEMMs (m = n = k) | bf16: 512 100.0 TFLOP/s |' "$tmp/out/summary.md" || fail "summary.md has no GEMM row"
grep -qF '| fitted bf16 buckets | 0.80 from m,n,k >= 0,0,0 |' "$tmp/out/summary.md" || fail "summary.md has no fitted buckets"

# The GPU probe fails: the shipped file with this host's CPU probe and nvidia-smi's memory; the plans run.
set +e
ZP_FAIL_GPU_PROBE=1 "$kit" --python "$tmp/bin/python" --out "$tmp/out6" --build-dir "$tmp/build6" >"$tmp/stdout6" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "a failed GPU probe exited $rc, not 2"
for s in probe-host cluster compare-s0 compare-om2; do
  grep -q "step $s: ok" "$tmp/out6/log.txt" || fail "after a failed GPU probe, step $s did not pass"
done
grep -q "failed steps: probe-gpu$" "$tmp/stdout6" || fail "the failed GPU probe is not named: $(tail -2 "$tmp/stdout6")"

# A CUDA test that skips (no GPU seen) fails the step.
set +e
ZP_SKIP=1 "$kit" --python "$tmp/bin/python" --out "$tmp/out3" --build-dir "$tmp/build3" >"$tmp/stdout3" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "a skipped CUDA test exited $rc, not 2"
grep -q "step cuda-tests: FAILED" "$tmp/out3/log.txt" || fail "a skipped CUDA test did not fail the step"
grep -q "exec_cuda_test: a CUDA test skipped" "$tmp/out3/log.txt" || fail "the skip is not named"

# --quick: three targets, fewer profile rounds and steps; --python NAME resolved on PATH (CMake wants a
# path); --bundle: the results in one folder.
"$kit" --quick --python python --out "$tmp/out4" --build-dir "$tmp/build4" --bundle "$tmp/bundle" \
  >"$tmp/stdout4" 2>&1 || fail "the quick run exited $? ($(tail -3 "$tmp/stdout4"))"
grep -q -- '--target zeroplan exec_cuda_test profiler_test' "$tmp/build4/build-args" || fail "--quick built: $(cat "$tmp/build4/build-args")"
grep -q 'step profile-gpt2-small: .*--repeats 3' "$tmp/out4/log.txt" || fail "--quick profiled with the default rounds"
grep -q "step configure: .*-DZEROPLAN_TORCH_FROM=$tmp/bin/python " "$tmp/out4/log.txt" || fail "--python python was not resolved to its path"
grep -q 'step run-s0: .*--steps 8 --warmup 2' "$tmp/out4/log.txt" || fail "--quick ran the default steps"
for f in summary.md log.txt versions.txt gpu-check.tgz; do [ -s "$tmp/bundle/$f" ] || fail "--bundle has no $f"; done
tar -tzf "$tmp/bundle/gpu-check.tgz" >"$tmp/bundle-list"   # (not piped into grep -q: pipefail and SIGPIPE)
grep -q 'out4/prediction-s0.json' "$tmp/bundle-list" || fail "the bundle's archive has no prediction"

# --grids: hfai's ResNet-50 activation-offload grid first (profiled at batch 256, fp32), then gpt2-small;
# an unknown grid is refused.
"$kit" --grids resnet50-offload,gpt2-small --python "$tmp/bin/python" --out "$tmp/out7" --build-dir "$tmp/build7" \
  >"$tmp/stdout7" 2>&1 || fail "the run with two grids exited $? ($(tail -3 "$tmp/stdout7"))"
grep -q 'step profile-resnet50-b256: .*--batch 256 --batches 128.\{0,1\},256' "$tmp/out7/log.txt" || fail "no batch-256 ResNet-50 profile"
grep -q 'step run-r50-act0.5: .*--model resnet --preset resnet50 --global-batch 256 --set zero_stage=0 --set offload.activations_ratio=0.5' \
  "$tmp/out7/log.txt" || fail "the ResNet-50 ratio 0.5 plan did not run as hfai's"
grep -q 'step simulate-r50-act1: .*resnet50-b256.json' "$tmp/out7/log.txt" || fail "the ResNet-50 plans were not simulated on the batch-256 profile"
grep -q 'step run-r50-act0: .*precision' "$tmp/out7/log.txt" && fail "the ResNet-50 grid ran in bf16 (hfai's is fp32)"
[ "$(grep -c '^| \(s\|om\|r50\)' "$tmp/out7/summary.md")" = 13 ] || fail "two grids: not 13 plan rows: $(cat "$tmp/out7/summary.md")"
[ "$(grep -m1 '^| \(s\|r50\)' "$tmp/out7/summary.md" | cut -d' ' -f2)" = r50-act0 ] || fail "the grids' rows are not in --grids order"
set +e
"$kit" --grids gpt2-small,bert --python "$tmp/bin/python" --out "$tmp/out8" >"$tmp/stdout8" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || fail "an unknown grid exited $rc, not 1"
grep -q 'unknown grid "bert"' "$tmp/stdout8" || fail "the unknown grid is not named: $(cat "$tmp/stdout8")"

# --deadline-s: a build slower than the deadline; every later step skipped, the table still written, exit 4.
set +e
ZP_BUILD_SLEEP=2 "$kit" --deadline-s 1 --python "$tmp/bin/python" --out "$tmp/out5" --build-dir "$tmp/build5" >"$tmp/stdout5" 2>&1
rc=$?
set -e
[ "$rc" = 4 ] || fail "a run past its deadline exited $rc, not 4 ($(tail -3 "$tmp/stdout5"))"
grep -q "step cuda-tests: skipped (the --deadline-s 1 s has passed" "$tmp/out5/log.txt" || fail "no skipped step logged"
grep -q "step run-s0:" "$tmp/out5/log.txt" && fail "a step started after the deadline"
[ "$(grep -c 'not run |$' "$tmp/out5/summary.md")" = 9 ] || fail "the table after the deadline: $(cat "$tmp/out5/summary.md")"
echo ok
