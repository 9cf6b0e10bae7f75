#!/usr/bin/env bash
# Scenario test: run one small CLI command and diff what it prints (stdout, stderr, exit code) against
# the checked-in expected output.
#   run_scenario.sh ZEROPLAN SCENARIO_DIR            check
#   run_scenario.sh ZEROPLAN SCENARIO_DIR --update   regenerate SCENARIO_DIR/expected
# SCENARIO_DIR/args holds the arguments, one per line; "@DIR@" becomes the scenario folder and "@OUT@"
# a fresh temporary folder. Files written into @OUT@ are part of the output (listed as "file NAME").
set -euo pipefail
zeroplan=$1; dir=$(cd "$2" && pwd); mode=${3:-check}
out=$(mktemp -d); actual=$(mktemp); trap 'rm -rf "$out" "$actual"' EXIT
mapfile -t args < <(sed -e "s|@DIR@|$dir|g" -e "s|@OUT@|$out|g" "$dir/args")
set +e
(cd "$out" && ZEROPLAN_DATA_DIR="${ZEROPLAN_DATA_DIR:-}" "$zeroplan" "${args[@]}" >"$out/.stdout" 2>"$out/.stderr")
rc=$?
set -e
{
  echo "exit $rc"
  echo "--- stdout"; cat "$out/.stdout"
  echo "--- stderr"; cat "$out/.stderr"
  for f in $(cd "$out" && find . -type f ! -name '.std*' | sort); do
    echo "--- file ${f#./}"; cat "$out/$f"
  done
} | sed -e "s|$out|@OUT@|g" -e "s|$dir|@DIR@|g" >"$actual"
if [ "$mode" = --update ]; then
  cp "$actual" "$dir/expected"; echo "updated $dir/expected"
else
  diff -u "$dir/expected" "$actual"
fi
