#!/usr/bin/env bash
# zeroplan tests: the set-up (scripts/setup.sh), then every test through CTest: unit tests, multi-rank
# tests over Gloo on 127.0.0.1, and scenario tests that diff CLI runs against checked-in outputs.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
build_dir=${ZEROPLAN_BUILD_DIR:-build}
cd "$root"
cmake --build "$build_dir" -j "${ZEROPLAN_JOBS:-$(nproc)}"   # the tests and benchmarks
ctest --test-dir "$build_dir" --output-on-failure -j "${ZEROPLAN_TEST_JOBS:-2}" --timeout 600 "$@"
