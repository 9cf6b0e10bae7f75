#!/usr/bin/env bash
# zeroplan tests: the set-up (scripts/setup.sh), then every test through CTest: unit tests, multi-rank
# tests over Gloo on 127.0.0.1, and scenario tests that diff CLI runs against checked-in outputs.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
build_dir=${ZEROPLAN_BUILD_DIR:-build}
cd "$root"
cmake --build "$build_dir" -j "${ZEROPLAN_JOBS:-$(nproc)}"   # the tests and benchmarks
# A build folder's first ctest has no timing data, and CTest would start the tests in their listed order:
# seed it with tests/ctest-costs.txt (CTest's own cost-data format: name, runs, seconds, from a full run
# on the 2-core development machine) so the longest start first and the two cores finish together.
# Regenerate from a full run's log: every test of 0.3 s or more as "name 1 seconds", then a line "---".
costs="$build_dir/Testing/Temporary/CTestCostData.txt"
if [ ! -s "$costs" ]; then mkdir -p "$(dirname "$costs")" && cp tests/ctest-costs.txt "$costs"; fi
ctest --test-dir "$build_dir" --output-on-failure -j "${ZEROPLAN_TEST_JOBS:-2}" --timeout 600 "$@"
