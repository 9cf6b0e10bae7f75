#!/usr/bin/env bash
# The notebooks (notebooks/*.ipynb) run top to bottom on the documents of a small run, so they never rot.
#   run_notebooks.sh documents ZEROPLAN DIR       write the documents of a small run into DIR (emptied first):
#                                                 profile --trace, probe --quick, simulate --trace and run --trace and
#                                                 compare for two plans, compare of the compare_basic scenario's
#                                                 hand-written documents (per-unit times), tune -o DIR/tune
#   run_notebooks.sh execute DIR NOTEBOOK...      execute each notebook with ZEROPLAN_DOCS=DIR; the executed
#                                                 copies go to DIR/../executed, their figures to DIR/../figures
#   run_notebooks.sh ZEROPLAN                     both, in a temporary folder
# Fails when a command fails, a cell raises, or a notebook is committed with outputs.
# Environment: ZEROPLAN_VENV (default: the repository's .venv).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${ZEROPLAN_VENV:-$root/.venv}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
say() { printf '[notebooks] %s\n' "$*" >&2; }

documents() {
  local zeroplan dir
  zeroplan=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  rm -rf "$2" && mkdir -p "$2" && dir=$(cd "$2" && pwd) && cd "$dir"
  local common=(--world-size 2 --global-batch 4)
  run_quiet() { local log=$1; shift; "$@" >"$log.log" 2>&1 || { cat "$log.log" >&2; say "failed: $*"; exit 1; }; }
  run_quiet probe "$zeroplan" probe --quick -o cluster.json
  run_quiet profile "$zeroplan" profile --model gpt --preset gpt2-tiny --batch 2 --threads 1 --trace profile.trace.json \
    -o model.json
  # Two plans: plain data parallelism, and stage 3 with gradients and optimizer state offloaded to the host.
  local -A plans=([ddp]="--set zero_stage=0"
                  [zero3-offload]="--set zero_stage=3 --set offload.grads=true --set offload.optimizer=true")
  local name
  for name in ddp zero3-offload; do
    # shellcheck disable=SC2206
    local set=(${plans[$name]})
    run_quiet "simulate-$name" "$zeroplan" simulate --model model.json --cluster cluster.json "${common[@]}" "${set[@]}" \
      --trace "prediction-$name.trace.json" -o "prediction-$name.json"
    run_quiet "run-$name" "$zeroplan" run --nproc 2 --model gpt --preset gpt2-tiny "${common[@]}" "${set[@]}" --steps 3 \
      --trace "run-$name.trace.json" -o "run-$name.json"
    run_quiet "compare-$name" "$zeroplan" compare --predicted "prediction-$name.json" --measured "run-$name.json" \
      --model model.json -o "comparison-$name.json"
  done
  # Hand-written documents with per-unit times (the executor records none yet), compared in a subfolder.
  mkdir scenario-compare_basic
  cp "$root"/tests/scenarios/compare_basic/{prediction.json,run_record.json,predicted.trace.json,rank0.trace.json,rank1.trace.json} scenario-compare_basic/
  (cd scenario-compare_basic && run_quiet compare "$zeroplan" compare --predicted prediction.json --measured run_record.json -o comparison.json)
  # The tuner with a device budget of 85% of what the default plan is predicted to need, so some plans do not fit.
  local budget_gib
  budget_gib=$("$venv/bin/python" -c 'import json; print(json.load(open("prediction-ddp.json"))["device"]["peak_bytes"] * 0.85 / 2**30)')
  run_quiet tune "$zeroplan" tune --model model.json --cluster cluster.json "${common[@]}" --device-memory-gib "$budget_gib" \
    --threads 1 -o tune
  rm -f ./*.log scenario-compare_basic/*.log
  say "documents in $dir: $(find . -name '*.json' | wc -l) files"
}

execute() {
  local dir out
  dir=$(cd "$1" && pwd); out=$(dirname "$dir"); shift
  [ -x "$venv/bin/jupyter" ] || { say "no $venv/bin/jupyter: run scripts/setup.sh (requirements.txt pins nbconvert)"; exit 1; }
  local nb
  for nb in "$@"; do
    # Committed notebooks keep no outputs: they are documents, not results.
    "$venv/bin/python" - "$nb" <<'PY'
import json, sys
cells = json.load(open(sys.argv[1]))["cells"]
dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
if dirty:
    sys.exit(f"{sys.argv[1]}: code cells {dirty} have outputs; strip them before committing "
             "(jupyter nbconvert --clear-output --inplace NOTEBOOK)")
PY
    say "executing $(basename "$nb")"
    ZEROPLAN_DOCS=$dir ZEROPLAN_FIGURES=$out/figures MPLBACKEND=Agg \
      "$venv/bin/jupyter" nbconvert --to notebook --execute --ExecutePreprocessor.timeout=120 \
      --ExecutePreprocessor.kernel_name=python3 --output-dir "$out/executed" "$nb"
  done
}

case ${1:-} in
  documents) documents "$2" "$3" ;;
  execute) shift; execute "$@" ;;
  "") echo "usage: $0 ZEROPLAN | documents ZEROPLAN DIR | execute DIR NOTEBOOK..." >&2; exit 2 ;;
  *)
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    (documents "$1" "$tmp/docs")
    execute "$tmp/docs" "$root"/notebooks/*.ipynb
    ;;
esac
