#!/usr/bin/env bash
# Regenerates tests/tuner/golden/ from the exporters: builds tuner_test and runs the golden tests with
# ZEROPLAN_UPDATE_GOLDEN=1. Review the diff (git diff tests/tuner/golden) before committing.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build-tuner}"
ninja -C "$build" -j2 tuner_test
ZEROPLAN_SOURCE_DIR="$root" ZEROPLAN_UPDATE_GOLDEN=1 "$build/tests/tuner/tuner_test" --gtest_filter='Export.GoldenFiles'
git -C "$root" status --short tests/tuner/golden
