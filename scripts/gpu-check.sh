#!/usr/bin/env bash
# zeroplan GPU kit: build and check zeroplan on a GPU machine that has a CUDA torch already installed in
# some Python but no network (issue #19).
#   1. prerequisites: compiler, CMake, Ninja, the Debian headers (or .deb files unpacked locally with
#      --debs), a Python whose torch imports with CUDA, nvidia-smi; records the GPU, driver and torch
#   2. configure against that torch (-DZEROPLAN_TORCH_FROM=<python>, not the pinned wheel) and build
#   3. every CUDA test (gtest names *_CUDA, through CTest): the profiler's CUDA events and CUPTI kernel
#      times (tests/profiles), and the executor's CUDA paths (tests/exec/step/cuda_test.cpp): pinned host
#      blocks from the caching host allocator, pinned copies on a side stream, the fused optimizer on
#      CUDA against the CPU, a one-rank NCCL all-reduce, caching-allocator peaks against the simulator
#   4. profile gpt2-small and resnet50 on the GPU
#   5. a single-GPU fidelity grid: simulate and run each plan (stage 0/1, optimizer offload,
#      checkpointing, activation offload ratios 0.1/0.5/1 on the side stream, OffloadModel), then
#      compare; prints predicted against measured step time and device peak
# Everything goes under --out (default gpu-check-<UTC time>/): log.txt, versions.txt, the profiles,
# predictions, run records, comparisons and summary.md.
#
#   scripts/gpu-check.sh [--python PY] [--out DIR] [--build-dir DIR] [--jobs N] [--debs DIR] [--steps N]
#   scripts/gpu-check.sh --dry-run [...]   on any machine: checks the prerequisites, prints every step it
#                                          would run, and (when a Python with torch is there) configures
#                                          into a scratch folder that it removes; never builds or runs.
# Exit: 0 ok (a dry run: the steps were printed); 1 bad arguments or a missing prerequisite (real run);
# 2 a step failed (real run; the log names it).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

dry_run=0
python=${ZEROPLAN_TORCH_PYTHON:-}
out=""
build_dir=""
jobs=$(nproc 2>/dev/null || echo 2)
debs=""
steps=20
usage() { sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --python) python=${2:?--python needs a path}; shift ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    --build-dir) build_dir=${2:?--build-dir needs a folder}; shift ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift ;;
    --debs) debs=${2:?--debs needs a folder}; shift ;;
    --steps) steps=${2:?--steps needs a number}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument \"$1\" (see --help)" >&2; exit 1 ;;
  esac
  shift
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: --jobs must be a positive integer (got \"$jobs\")" >&2; exit 1; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: --steps must be a positive integer (got \"$steps\")" >&2; exit 1; }
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=$(command -v python3 || echo python3); fi
fi
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=${out:-$root/gpu-check-$stamp}
build_dir=${build_dir:-$root/build-gpu}
zp="$build_dir/zeroplan"

# Every line goes to stdout and, in a real run, to log.txt (the steps' own output goes there too).
say() {
  printf '[gpu-check] %s\n' "$*"
  if ((!dry_run)) && [ -d "$out" ]; then printf '[gpu-check] %s\n' "$*" >>"$out/log.txt"; fi
}
log() { say "$*"; }

# ---- 1. prerequisites ------------------------------------------------------------------------------
missing=()   # what a real run needs and this machine lacks
have() { command -v "$1" >/dev/null 2>&1; }
check() {  # check WHAT OK-COMMAND...: one line per prerequisite
  local what=$1; shift
  if "$@" >/dev/null 2>&1; then say "ok       $what"; else say "missing  $what"; missing+=("$what;"); fi
}
header_in() {  # header_in HEADER: in /usr/include, or in one of the --debs packages (unpacked at configure)
  [ -e "/usr/include/$1" ] && return 0
  [ -n "$debs" ] || return 1
  local d
  for d in "$debs"/*.deb; do
    [ -e "$d" ] && dpkg-deb -c "$d" 2>/dev/null | grep -q -- "\./usr/include/$1\$" && return 0
  done
  return 1
}
if ((!dry_run)); then mkdir -p "$out" || exit 1; fi
say "zeroplan GPU kit ($( ((dry_run)) && echo 'dry run: nothing is built or run' || echo "writing $out"))"
check "C++ compiler (g++)" have g++
check "CMake" have cmake
check "Ninja" have ninja
check "nlohmann_json headers" header_in nlohmann/json.hpp
check "fmt headers" header_in fmt/format.h
check "Boost.Graph headers" header_in boost/graph/adjacency_list.hpp
check "CLI11 headers" header_in CLI/CLI.hpp
check "GoogleTest headers" header_in gtest/gtest.h
check "Google Benchmark headers" header_in benchmark/benchmark.h
check "gloo headers (ProcessGroupGloo.hpp includes them)" header_in gloo/config.h
check "a Python that imports torch ($python)" "$python" -c "import torch"
check "torch built with CUDA" "$python" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)"
check "a CUDA device visible to torch" "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
check "nvidia-smi" have nvidia-smi
check "CUDA toolkit (nvcc; gates the CUDA code paths)" bash -c 'command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]'

torch_version=$("$python" -W ignore -c "import torch; print(torch.__version__)" 2>/dev/null || echo "none")
torch_cuda=$("$python" -W ignore -c "import torch; print(torch.version.cuda or 'cpu')" 2>/dev/null || echo "none")
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
gpu=${gpu:-none}
say "torch $torch_version (CUDA $torch_cuda) from $python"
say "GPU: $gpu"
if ((!dry_run)); then
  {
    echo "date_utc $stamp"
    echo "torch $torch_version"
    echo "torch_cuda $torch_cuda"
    echo "python $python"
    echo "gpu $gpu"
    echo "zeroplan_commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  } >"$out/versions.txt"
  if ((${#missing[@]})); then
    say "cannot run: missing ${missing[*]}"
    exit 1
  fi
fi

# The GPU's shipped cluster file, for the simulator (else this machine's probe).
case "$gpu" in
  *H100*) cluster=h100-sxm-80gb ;;
  *A100*80GB*) cluster=a100-sxm-80gb ;;
  *A100*) cluster=a100-sxm-40gb ;;
  *) cluster="$out/local.json" ;;
esac

# ---- steps: printed in a dry run, run (and logged) otherwise --------------------------------------
failed=()
step() {  # step NAME COMMAND...
  local name=$1; shift
  if ((dry_run)); then
    printf '[gpu-check] step %-28s %s\n' "$name" "$(printf '%q ' "$@")"
    return 0
  fi
  log "step $name: $(printf '%q ' "$@")"
  local t0=$SECONDS
  if "$@" >>"$out/log.txt" 2>&1; then
    log "step $name: ok ($((SECONDS - t0)) s)"
  else
    log "step $name: FAILED ($((SECONDS - t0)) s, see log.txt)"
    failed+=("$name")
    return 1
  fi
}

# 2. configure and build against this machine's torch (.deb headers unpacked locally when given).
cmake_args=(-S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DZEROPLAN_TORCH_FROM=$python" -DZEROPLAN_WITH_CUDA=ON)
if [ -n "$debs" ]; then
  prefix="$build_dir/debs"
  step unpack-debs bash -c "mkdir -p '$prefix' && for d in '$debs'/*.deb; do dpkg-deb -x \"\$d\" '$prefix'; done"
  cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix/usr" "-DCMAKE_CXX_FLAGS=-isystem $prefix/usr/include")
fi
step configure cmake "${cmake_args[@]}"
step build cmake --build "$build_dir" -j "$jobs"

# 3. the CUDA tests (named *_CUDA, skipped where no GPU is present, so here they must run; the list is in
#    the header above).
step cuda-tests ctest --test-dir "$build_dir" -R _CUDA --output-on-failure --no-tests=error

# 4. profiles on the GPU.
step profile-gpt2-small "$zp" profile --model gpt --preset gpt2-small --seq 1024 --batch 4 --batches 2,4 \
  --dtype bf16 --device cuda -o "$out/gpt2-small.json"
step profile-resnet50 "$zp" profile --model resnet --preset resnet50 --batch 32 --batches 16,32 \
  --device cuda -o "$out/resnet50.json"
case "$cluster" in
  */local.json) step probe "$zp" probe -o "$out/local.json" ;;
esac

# 5. single-GPU fidelity grid on gpt2-small: simulate, run, compare.
grid=(
  "s0:--set zero_stage=0"
  "s1:--set zero_stage=1"
  "s1-offload:--set zero_stage=1 --set offload.optimizer=true"
  "s0-ckpt:--set zero_stage=0 --set checkpointing=all"
  "s1-offload-ckpt:--set zero_stage=1 --set offload.optimizer=true --set checkpointing=all"
  "s0-act0.1:--set zero_stage=0 --set offload.activations_ratio=0.1"
  "s0-act0.5:--set zero_stage=0 --set offload.activations_ratio=0.5"
  "s0-act1:--set zero_stage=0 --set offload.activations_ratio=1"
  "om2:--set zero_stage=0 --set offload_model.enabled=true --set offload_model.slices=2"
)
precision=(--set precision.param_dtype=bf16 --set precision.compute_dtype=bf16 --set precision.reduce_dtype=bf16)
for entry in "${grid[@]}"; do
  name=${entry%%:*}
  read -r -a sets <<<"${entry#*:}"
  # A plan's steps stop at its first failure (its row then says "not run"); the next plan still runs.
  step "simulate-$name" "$zp" simulate --model "$out/gpt2-small.json" --cluster "$cluster" --world-size 1 \
    --global-batch 4 "${precision[@]}" "${sets[@]}" -o "$out/prediction-$name.json" &&
  step "run-$name" "$zp" run --device cuda --model gpt --preset gpt2-small --seq 1024 --global-batch 4 \
    "${precision[@]}" "${sets[@]}" --steps "$steps" --warmup 3 -o "$out/run-$name.json" &&
  step "compare-$name" "$zp" compare --predicted "$out/prediction-$name.json" --measured "$out/run-$name.json" \
    -o "$out/comparison-$name.json" ||
  log "plan $name: stopped at its failed step"
done

# The table: predicted against measured, per plan (torch version and GPU on top).
summarize() {
  "$python" - "$out" "$torch_version" "$gpu" "${grid[@]%%:*}" <<'PY'
import json, os, sys
out, torch, gpu, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print(f"Measured on {gpu} with torch {torch} (scripts/gpu-check.sh)\n")
print("| plan | predicted step (ms) | measured step (ms) | error | predicted device peak (GiB) | measured device peak (GiB) | verdict |")
print("|---|---|---|---|---|---|---|")
for n in names:
    try:
        p = json.load(open(os.path.join(out, f"prediction-{n}.json")))
        c = json.load(open(os.path.join(out, f"comparison-{n}.json")))
    except OSError:
        print(f"| {n} | | | | | | not run |"); continue
    rows = {m.get("name"): m for m in c.get("metrics", [])}
    step = rows.get("step_time_s", {})
    peak = rows.get("device_peak_bytes.rank0", {})
    g = 2 ** 30
    nan = float("nan")
    print(f"| {n} | {1e3 * p['step_time_s']:.1f} | {1e3 * step.get('measured', nan):.1f} | "
          f"{100 * step.get('rel_error', nan):+.1f}% | {p['device']['peak_bytes'] / g:.2f} | "
          f"{peak.get('measured', nan) / g:.2f} | {c.get('verdict', '')} |")
PY
}
if ((dry_run)); then
  say "step summary                      (reads every prediction and comparison into $out/summary.md)"
  # A configure into a scratch folder, when it is cheap here (a Python with torch and CMake present).
  if have cmake && "$python" -c "import torch" >/dev/null 2>&1; then
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    if cmake -S "$root" -B "$scratch" -G Ninja "-DZEROPLAN_TORCH_FROM=$python" -DZEROPLAN_BUILD_TESTS=OFF \
         >"$scratch.log" 2>&1; then
      say "configure check: ok against torch $torch_version (scratch folder removed)"
    else
      say "configure check: FAILED against torch $torch_version:"
      tail -5 "$scratch.log" | sed 's/^/[gpu-check]   /'
      rm -f "$scratch.log"
      exit 2
    fi
    rm -f "$scratch.log"
  else
    say "configure check: skipped (no CMake or no Python with torch here)"
  fi
  say "missing here: ${missing[*]:-nothing}"
  say "dry run done: the real run would write $out"
  exit 0
fi
summarize >"$out/summary.md"
cat "$out/summary.md" | tee -a "$out/log.txt"
if ((${#failed[@]})); then
  say "failed steps: ${failed[*]}"
  exit 2
fi
say "all steps passed; results in $out"
