#!/usr/bin/env bash
# scripts/gpu-check.sh's real path (not the dry run) on stand-ins: a Python that reports a CUDA torch and
# a device, nvidia-smi naming an H100, nvcc, and cmake, ctest and zeroplan that only write the documents the
# kit reads. Checks the kit runs every step in order, simulates against the GPU's shipped cluster,
# records the GPU and torch version, writes the predicted-against-measured table, and that a failing
# step ends it with exit 2 naming the step, stops that plan (its row says "not run") and the next plans
# still run.
#   gpu_check_fake_run.sh SCRIPT
set -euo pipefail
kit=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; for f in "$tmp"/out*/log.txt; do echo "--- $f"; cat "$f"; done; exit 1; }
mkdir -p "$tmp/bin"
real_python=$(command -v python3)
cat >"$tmp/bin/python" <<PY
#!/usr/bin/env bash
# Stands in for a Python with a CUDA torch 9.9.9 and a visible device; anything else goes to python3.
if [ "\${1:-}" = -c ] || { [ "\${1:-}" = -W ] && [ "\${3:-}" = -c ]; }; then
  code=\${!#}
  case "\$code" in
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
# configure: make the build folder and a stand-in zeroplan; --build: nothing to do.
[ "$1" = --build ] && exit 0
while (($#)); do [ "$1" = -B ] && build=$2; shift; done
mkdir -p "$build" && cp "$ZP_STUB" "$build/zeroplan" && chmod +x "$build/zeroplan"
SH
printf '#!/usr/bin/env bash\nexit 0\n' >"$tmp/bin/ctest"
printf '#!/usr/bin/env bash\nexit 0\n' >"$tmp/bin/nvcc"
cat >"$tmp/zeroplan" <<'SH'
#!/usr/bin/env bash
# Writes what each subcommand's -o would hold, just enough for the kit's table.
cmd=$1; out=""; all="$*"
while (($#)); do [ "$1" = -o ] && out=$2; shift; done
[ -n "${ZP_FAIL:-}" ] && [[ "$all" == *"$ZP_FAIL"* ]] && [ "$cmd" = run ] && exit 3
case "$cmd" in
  simulate) [[ "$all" == *"--cluster h100-sxm-80gb"* ]] || exit 1
            echo '{"step_time_s": 0.1, "device": {"peak_bytes": 2147483648}}' >"$out" ;;
  compare) echo '{"metrics": [{"name": "step_time_s", "measured": 0.125, "rel_error": -0.2},
                               {"name": "device_peak_bytes.rank0", "measured": 3221225472}], "verdict": "fail"}' >"$out" ;;
  *) echo '{}' >"$out" ;;
esac
SH
chmod +x "$tmp/bin/python" "$tmp/bin/nvidia-smi" "$tmp/bin/cmake" "$tmp/bin/ctest" "$tmp/bin/nvcc" "$tmp/zeroplan"
export ZP_STUB="$tmp/zeroplan"
export PATH="$tmp/bin:$PATH"

"$kit" --python "$tmp/bin/python" --out "$tmp/out" --build-dir "$tmp/build" --jobs 2 >"$tmp/stdout" 2>&1 ||
  fail "the run exited $? ($(tail -3 "$tmp/stdout"))"
grep -q '^torch 9.9.9+cu999$' "$tmp/out/versions.txt" || fail "versions.txt has no torch line"
grep -q '^gpu NVIDIA H100 80GB HBM3' "$tmp/out/versions.txt" || fail "versions.txt has no GPU line"
for s in configure build cuda-tests profile-gpt2-small profile-resnet50 simulate-s0 run-s0 compare-s0 \
         simulate-s1-offload-ckpt run-s1-offload-ckpt compare-s1-offload-ckpt run-s0-act0.5 run-om2; do
  grep -q "step $s: ok" "$tmp/out/log.txt" || fail "step $s did not pass"
done
grep -q "step probe" "$tmp/out/log.txt" && fail "an H100 is simulated on its shipped cluster, no probe"
grep -q '^Measured on NVIDIA H100 80GB HBM3, 999.99, 81559 MiB with torch 9.9.9+cu999' "$tmp/out/summary.md" ||
  fail "summary.md has no heading with the GPU and torch"
grep -qF '| s1-offload | 100.0 | 125.0 | -20.0% | 2.00 | 3.00 | fail |' "$tmp/out/summary.md" || fail "summary row: $(cat "$tmp/out/summary.md")"
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
grep -qF '| s0-ckpt | | | | | | not run |' "$tmp/out2/summary.md" || fail "a plan whose run failed: $(cat "$tmp/out2/summary.md")"
echo ok
