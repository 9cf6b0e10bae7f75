#!/usr/bin/env bash
# scripts/gpu-check.sh --dry-run (the GPU kit on a CPU machine, as CI runs it): exits 0, prints every step
# a real run takes (configure against the machine's torch, build, the *_CUDA tests, the two GPU profiles,
# the GPU probe over the part's file (and its fallback: the host probe and the composed cluster),
# simulate/run/compare for each plan of the single-GPU grid, the summary) and the torch version, creates
# nothing, and refuses bad arguments in one line with exit 1.
#   gpu_check_dry_run.sh SCRIPT
set -euo pipefail
kit=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; echo "--- output"; cat "$tmp/stdout"; exit 1; }

"$kit" --dry-run --out "$tmp/out" --build-dir "$tmp/build" >"$tmp/stdout" 2>"$tmp/stderr" || fail "dry run exited $?"
out=$(cat "$tmp/stdout")
expect() { grep -qE -- "$1" <<<"$out" || fail "no line matching: $1"; }
expect '^\[gpu-check\] torch [^ ]+ \(CUDA [^ ]+\) from '
expect '^\[gpu-check\] GPU: '
expect '^\[gpu-check\] (ok|missing) +a Python that imports torch'
expect '^\[gpu-check\] step configure .*-DZEROPLAN_TORCH_FROM=.*-DZEROPLAN_WITH_CUDA=ON'
expect '^\[gpu-check\] step build .*cmake --build'
expect '^\[gpu-check\] step cuda-tests +cuda_tests'
expect '^\[gpu-check\] step probe-gpu .* probe --device cuda --base '
expect '^\[gpu-check\] step probe-host .* probe --no-collectives'
expect '^\[gpu-check\] step cluster +compose_cluster'
expect '^\[gpu-check\] step profile-gpt2-small .* profile --model gpt --preset gpt2-small .*--device cuda'
expect '^\[gpu-check\] step profile-resnet50 .* profile --model resnet --preset resnet50 .*--device cuda'
for plan in s0 s1 s1-offload s0-ckpt s1-offload-ckpt; do
  expect "^\[gpu-check\] step simulate-$plan .* simulate .*--world-size 1"
  expect "^\[gpu-check\] step run-$plan .* run --device cuda"
  expect "^\[gpu-check\] step compare-$plan .* compare "
done
expect 'step simulate-s1-offload .*offload.optimizer=true'
expect 'step run-s0-ckpt .*checkpointing=all'
expect '^\[gpu-check\] step summary'
expect '^\[gpu-check\] configure check: (ok|skipped)'
expect '^\[gpu-check\] dry run done'
[ ! -e "$tmp/out" ] || fail "the dry run created its output folder"
[ ! -e "$tmp/build" ] || fail "the dry run created its build folder"

# Headers found only in --debs packages (none in the system include folder): a package whose listing is
# long (the Boost headers' is: grep -q stopping early once SIGPIPE'd dpkg-deb and, under pipefail,
# reported the header missing) counts, the headers of no package stay missing.
mkdir -p "$tmp/pkg/DEBIAN" "$tmp/pkg/usr/include/boost/graph" "$tmp/debs" "$tmp/empty"
printf 'Package: fake-boost\nVersion: 1\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n' >"$tmp/pkg/DEBIAN/control"
touch "$tmp/pkg/usr/include/boost/graph/adjacency_list.hpp"
for i in $(seq 1 3000); do touch "$tmp/pkg/usr/include/boost/graph/zz_filler_header_number_$i.hpp"; done
dpkg-deb --build --root-owner-group "$tmp/pkg" "$tmp/debs/fake-boost.deb" >/dev/null
GPU_CHECK_NO_CONFIGURE=1 GPU_CHECK_SYSTEM_INCLUDE="$tmp/empty" "$kit" --dry-run --debs "$tmp/debs" --out "$tmp/out" --build-dir "$tmp/build" \
  >"$tmp/stdout" 2>"$tmp/stderr" || fail "dry run with --debs exited $?"
grep -q '^\[gpu-check\] ok       Boost.Graph headers' "$tmp/stdout" || fail "the header in a --debs package was not found"
grep -q '^\[gpu-check\] missing  fmt headers' "$tmp/stdout" || fail "a header in no package was found"
grep -q 'step unpack-debs' "$tmp/stdout" || fail "no unpack step with --debs"

# Bad arguments: one line, exit 1.
set +e
GPU_CHECK_NO_CONFIGURE=1 "$kit" --dry-run --bogus >"$tmp/stdout" 2>"$tmp/stderr"; rc=$?
set -e
[ "$rc" = 1 ] || fail "--bogus exited $rc, not 1"
grep -q 'unknown argument "--bogus"' "$tmp/stderr" || fail "--bogus: $(cat "$tmp/stderr")"
set +e
GPU_CHECK_NO_CONFIGURE=1 "$kit" --dry-run --jobs 0 >"$tmp/stdout" 2>"$tmp/stderr"; rc=$?
set -e
[ "$rc" = 1 ] || fail "--jobs 0 exited $rc, not 1"
echo "ok"
