#!/usr/bin/env bash
# zeroplan GPU kit: build and check zeroplan on a GPU machine that has a CUDA torch already installed in
# some Python but no network (issue #19).
#   1. prerequisites: compiler, CMake, Ninja, the Debian headers (or .deb files unpacked locally with
#      --debs), a Python whose torch imports with CUDA, nvidia-smi; records the GPU, driver and torch
#   2. configure against that torch (-DZEROPLAN_TORCH_FROM=<python>, not the pinned wheel) and build
#   3. every CUDA test (gtest names *_CUDA, the test binaries run with --gtest_filter; a skipped test fails
#      the step, since here the GPU must be there): the profiler's CUDA events and CUPTI kernel times
#      (tests/profiles), and the executor's CUDA paths (tests/exec/step/cuda_test.cpp): pinned host
#      blocks from the caching host allocator, pinned copies on a side stream, the fused optimizer on
#      CUDA against the CPU, a one-rank NCCL all-reduce, caching-allocator peaks against the simulator
#   4. profile gpt2-small and resnet50 on the GPU; the cluster to simulate on: `zeroplan probe --device
#      cuda` over the GPU's shipped file (H100, H200, A100): its datasheet peaks stay, the device's memory,
#      copy bandwidth, launch overhead, pinned/pageable copies and a bf16/fp16 GEMM sweep (fitted to the
#      file's buckets) and the host are measured; if that fails, the shipped file with this host's CPU
#      probe (`probe --no-collectives`) and the device memory nvidia-smi reports
#   5. a single-GPU fidelity grid: simulate and run each plan (stage 0/1, optimizer offload,
#      checkpointing, activation offload ratios 0.1/0.5/1 on the side stream, OffloadModel), then
#      compare; prints predicted against measured step time, device peak and host blocks
# Everything goes under --out (default gpu-check-<UTC time>/): log.txt, versions.txt (its commit line from
# ZEROPLAN_COMMIT when set: a copied working tree may carry another checkout's .git), the profiles,
# predictions, run records, comparisons and summary.md.
#
#   scripts/gpu-check.sh [--python PY] [--out DIR] [--build-dir DIR] [--jobs N] [--debs DIR] [--steps N]
#                        [--quick] [--build-only] [--deadline-s S] [--bundle DIR] [--grids LIST]
#   --quick        fit a lent machine's few minutes: build only the binary and the two CUDA test
#                  binaries, profile with fewer rounds, run each plan 8 steps (2 warm-up)
#   --build-only   stop after the build (no GPU needed: checks a foreign torch builds, CUDA on)
#   --deadline-s S start no step after S seconds (the rest are logged "skipped"); the summary is always
#                  written, so a lease's time limit never loses what was measured
#   --bundle DIR   at the end copy summary.md, log.txt and versions.txt to DIR, with everything in
#                  DIR/gpu-check.tgz (a device tool's $OUT: few files, two folders deep)
#   --debs DIR     .deb files (scripts/gpu-kit-pack.sh) unpacked into the build folder, searched first
#   --grids LIST   the fidelity grids to run, in this order, comma-separated (default gpt2-small):
#                  gpt2-small (the nine plans of step 5), resnet50-offload (hfai's activation-offload
#                  study: ResNet-50 in fp32 at batch 256, ratios 0, 0.1, 0.5 and 1, profiled at batch 256)
#   scripts/gpu-check.sh --dry-run [...]   on any machine: checks the prerequisites, prints every step it
#                                          would run, and (when a Python with torch is there) configures
#                                          into a scratch folder that it removes; never builds or runs.
# Exit: 0 ok (a dry run: the steps were printed); 1 bad arguments or a missing prerequisite (real run);
# 2 a step failed (real run; the log names it); 4 no step failed but the deadline skipped some.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

dry_run=0
python=${ZEROPLAN_TORCH_PYTHON:-}
out=""
build_dir=""
jobs=$(nproc 2>/dev/null || echo 2)
debs=""
steps=20
quick=0
build_only=0
deadline_s=0
bundle=""
grids=gpt2-small
usage() { sed -n '2,41p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --python) python=${2:?--python needs a path}; shift ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    --build-dir) build_dir=${2:?--build-dir needs a folder}; shift ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift ;;
    --debs) debs=${2:?--debs needs a folder}; shift ;;
    --steps) steps=${2:?--steps needs a number}; shift ;;
    --quick) quick=1 ;;
    --build-only) build_only=1 ;;
    --deadline-s) deadline_s=${2:?--deadline-s needs a number of seconds}; shift ;;
    --bundle) bundle=${2:?--bundle needs a folder}; shift ;;
    --grids) grids=${2:?--grids needs a list}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument \"$1\" (see --help)" >&2; exit 1 ;;
  esac
  shift
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: --jobs must be a positive integer (got \"$jobs\")" >&2; exit 1; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: --steps must be a positive integer (got \"$steps\")" >&2; exit 1; }
[[ "$deadline_s" =~ ^[0-9]+$ ]] || { echo "gpu-check: --deadline-s must be a number of seconds (got \"$deadline_s\")" >&2; exit 1; }
IFS=, read -r -a grid_list <<<"$grids"
for g in "${grid_list[@]}"; do
  case "$g" in
    gpt2-small|resnet50-offload) ;;
    *) echo "gpu-check: --grids: unknown grid \"$g\" (gpt2-small, resnet50-offload)" >&2; exit 1 ;;
  esac
done
((${#grid_list[@]})) || { echo "gpu-check: --grids names no grid" >&2; exit 1; }
if [ -n "$debs" ] && ! compgen -G "$debs/*.deb" >/dev/null; then
  echo "gpu-check: --debs $debs holds no .deb files (scripts/gpu-kit-pack.sh makes them)" >&2; exit 1
fi
warmup=3
rounds=()
if ((quick)); then
  ((steps == 20)) && steps=8
  warmup=2
  rounds=(--repeats 3)
fi
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=$(command -v python3 || echo python3); fi
fi
case "$python" in  # CMake wants a path: "python3" becomes the one on PATH
  */*) ;;
  *) python=$(command -v "$python" || echo "$python") ;;
esac
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
check_gpu() {  # check_gpu WHAT OK-COMMAND...: needed to run on the GPU, not to build (--build-only)
  if ((build_only)); then
    local what=$1; shift
    if "$@" >/dev/null 2>&1; then say "ok       $what"; else say "absent   $what (not needed: --build-only)"; fi
  else
    check "$@"
  fi
}
system_include=${GPU_CHECK_SYSTEM_INCLUDE:-/usr/include}   # tests point it at an empty folder
header_in() {  # header_in HEADER: in /usr/include, or in one of the --debs packages (unpacked at configure)
  [ -e "$system_include/$1" ] && return 0
  [ -n "$debs" ] || return 1
  local d
  for d in "$debs"/*.deb; do
    # grep without -q reads the whole listing: with pipefail, -q's early exit would SIGPIPE dpkg-deb and fail
    [ -e "$d" ] && dpkg-deb -c "$d" 2>/dev/null | grep -- "\./usr/include/$1\$" >/dev/null && return 0
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
# One import of torch (two seconds each on a small machine) answers every torch question below.
torch_facts=$("$python" -W ignore -c "import torch; print(torch.__version__, torch.version.cuda or 'cpu', int(torch.cuda.is_available()))" 2>/dev/null | tail -1)
read -r torch_version torch_cuda torch_gpus <<<"${torch_facts:-none none 0}"
check "a Python that imports torch ($python)" test "$torch_version" != none
check "torch built with CUDA" bash -c '[ "$1" != cpu ] && [ "$1" != none ]' _ "$torch_cuda"
check_gpu "a CUDA device visible to torch" test "$torch_gpus" = 1
check_gpu "nvidia-smi" have nvidia-smi
check "CUDA toolkit (nvcc; gates the CUDA code paths)" bash -c 'command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]'

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
    # A copied working tree may carry another checkout's .git: ZEROPLAN_COMMIT names the commit it is.
    echo "zeroplan_commit ${ZEROPLAN_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}"
    echo "cores $(nproc 2>/dev/null || echo unknown)"
  } >"$out/versions.txt"
  if ((${#missing[@]})); then
    say "cannot run: missing ${missing[*]}"
    exit 1
  fi
fi

# The GPU's shipped cluster file; the simulator gets it with this machine's host and the device memory
# nvidia-smi reports (cluster_here below). A GPU without a shipped file: the H100's, said in the log.
case "$gpu" in
  *H200*) base_cluster=h200-sxm-141gb ;;
  *H100*) base_cluster=h100-sxm-80gb ;;
  *A100*80GB*) base_cluster=a100-sxm-80gb ;;
  *A100*) base_cluster=a100-sxm-40gb ;;
  *) base_cluster=h100-sxm-80gb; say "no shipped cluster file for \"$gpu\": the H100's stands in for its device" ;;
esac
cluster="$out/cluster.json"
gpu_mem_mib=$(awk -F', ' '{print $3}' <<<"$gpu" | tr -dc 0-9)   # "name, driver, 81559 MiB"

# ---- steps: printed in a dry run, run (and logged) otherwise --------------------------------------
failed=()
skipped=()
step() {  # step NAME COMMAND...
  local name=$1; shift
  if ((dry_run)); then
    printf '[gpu-check] step %-28s %s\n' "$name" "$(printf '%q ' "$@")"
    return 0
  fi
  if ((deadline_s > 0 && SECONDS >= deadline_s)); then
    log "step $name: skipped (the --deadline-s $deadline_s s has passed: $SECONDS s)"
    skipped+=("$name")
    return 1
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
  "-DZEROPLAN_TORCH_FROM=$python" -DZEROPLAN_WITH_CUDA=ON -DZEROPLAN_WERROR=OFF -DZEROPLAN_WITH_PYTHON=OFF)
if [ -n "$debs" ]; then
  prefix="$build_dir/debs"
  step unpack-debs bash -c "mkdir -p '$prefix' && for d in '$debs'/*.deb; do dpkg-deb -x \"\$d\" '$prefix'; done"
  cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix/usr" "-DCMAKE_CXX_FLAGS=-isystem $prefix/usr/include")
fi
# The CUDA tests live in two binaries; --quick builds those and the zeroplan binary only.
cuda_test_bins=("$build_dir/tests/exec/exec_cuda_test" "$build_dir/tests/profiles/profiler_test")
build_targets=()
((quick)) && build_targets=(--target zeroplan exec_cuda_test profiler_test)
step configure cmake "${cmake_args[@]}"
step build cmake --build "$build_dir" -j "$jobs" "${build_targets[@]}"

# 3. the CUDA tests (named *_CUDA; they skip where no GPU is present, so here a skip is a failure).
cuda_tests() {
  local bin text rc=0
  for bin in "${cuda_test_bins[@]}"; do
    text=$("$bin" --gtest_filter='*_CUDA' 2>&1) || rc=1
    printf '%s\n' "$text"
    grep -q '^\[  SKIPPED \]' <<<"$text" && { echo "gpu-check: $(basename "$bin"): a CUDA test skipped"; rc=1; }
    grep -qE '^\[  PASSED  \] [1-9]' <<<"$text" || { echo "gpu-check: $(basename "$bin"): no CUDA test passed"; rc=1; }
  done
  return $rc
}
if ((build_only)); then
  ((dry_run)) || { log "build only: done (${#failed[@]} failed steps)"; ((${#failed[@]})) && exit 2; exit 0; }
fi
step cuda-tests cuda_tests

# 4. profiles on the GPU, and the cluster to simulate on: the GPU's shipped file, with this machine's host
#    (the probe without collectives: one GPU) and the device memory nvidia-smi reports.
step profile-gpt2-small "$zp" profile --model gpt --preset gpt2-small --opt seq=1024 --batch 4 --batches 2,4 \
  --dtype bf16 --device cuda "${rounds[@]}" -o "$out/gpt2-small.json"
step profile-resnet50 "$zp" profile --model resnet --preset resnet50 --batch 32 --batches 16,32 \
  --device cuda "${rounds[@]}" -o "$out/resnet50.json"
# The cluster: `probe --device cuda` over the part's shipped file (device copies, pinned and pageable host
# copies, launch overhead, a bf16/fp16 GEMM sweep fitted to the file's buckets, the host); if it fails,
# the shipped file with this host's CPU probe and nvidia-smi's memory.
compose_cluster() {
  "$python" - "$base_cluster" "$out/host-probe.json" "$cluster" "${gpu_mem_mib:-0}" "$gpu" "$stamp" <<'PY'
import json, sys
base, probe_path, out, mem_mib, gpu, stamp = sys.argv[1:]
probe = json.load(open(probe_path))
host_keys = ("mem_bytes", "cores", "memcpy_bw_bytes_per_s", "optimizer")
child = {"schema": "zeroplan.cluster/1", "extends": base, "name": base + "-here",
         "description": f"{gpu}: the shipped {base} device with this machine's host (zeroplan probe) and device memory",
         "nodes": 1, "devices_per_node": 1,
         "host": {k: probe["host"][k] for k in host_keys}, "provenance": {}}
for path, prov in probe.get("provenance", {}).items():
    if any(path == "host." + k or path.startswith("host." + k + ".") for k in host_keys):
        child["provenance"][path] = prov
child["provenance"]["devices_per_node"] = {"source": "probe", "citation": "one GPU on this machine (scripts/gpu-check.sh)"}
if int(mem_mib) > 0:
    child["device"] = {"mem_bytes": int(mem_mib) << 20}
    child["provenance"]["device.mem_bytes"] = {"source": "probe", "citation": f"nvidia-smi memory.total on {stamp}: {mem_mib} MiB"}
json.dump(child, open(out, "w"), indent=2)
PY
}
fallback_cluster() {
  step probe-host "$zp" probe --no-collectives -o "$out/host-probe.json" && step cluster compose_cluster
}
if ((dry_run)); then
  step probe-gpu "$zp" probe --device cuda --base "$base_cluster" -o "$cluster"
  say "  (if probe-gpu fails:)"
  fallback_cluster
elif ! step probe-gpu "$zp" probe --device cuda --base "$base_cluster" -o "$cluster"; then
  log "the GPU probe failed: simulating on $base_cluster with this host's CPU probe instead"
  fallback_cluster
fi

# 5. single-GPU fidelity grids: simulate, run, compare each plan.
#    gpt2-small in bf16 at batch 4 x 1024: stages, optimizer offload, checkpointing, activation offload,
#    OffloadModel.
gpt2_grid=(
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
#    resnet50-offload: hfai's CPUOffload study (ResNet-50, fp32, batch 256; hfai measured 22.4 / 20.3 /
#    11.8 / 4.4 GB on an A100 40GB at ratios 0 / 0.1 / 0.5 / 1), profiled at that batch here.
resnet_grid=(
  "r50-act0:--set zero_stage=0"
  "r50-act0.1:--set zero_stage=0 --set offload.activations_ratio=0.1"
  "r50-act0.5:--set zero_stage=0 --set offload.activations_ratio=0.5"
  "r50-act1:--set zero_stage=0 --set offload.activations_ratio=1"
)
gpt2_precision=(--set precision.param_dtype=bf16 --set precision.compute_dtype=bf16 --set precision.reduce_dtype=bf16)
run_grid() {  # run_grid PROFILE "MODEL ARGS" "SIMULATE/RUN ARGS" ENTRY...
  local profile=$1 name sets entry
  read -r -a model_args <<<"$2"
  read -r -a common <<<"$3"
  shift 3
  for entry in "$@"; do
    name=${entry%%:*}
    read -r -a sets <<<"${entry#*:}"
    # A plan's steps stop at its first failure (its row then says "not run"); the next plan still runs.
    step "simulate-$name" "$zp" simulate --model "$profile" --cluster "$cluster" --world-size 1 \
      "${common[@]}" "${sets[@]}" -o "$out/prediction-$name.json" &&
    step "run-$name" "$zp" run --device cuda "${model_args[@]}" \
      "${common[@]}" "${sets[@]}" --steps "$steps" --warmup "$warmup" -o "$out/run-$name.json" &&
    step "compare-$name" "$zp" compare --predicted "$out/prediction-$name.json" --measured "$out/run-$name.json" \
      -o "$out/comparison-$name.json" ||
    log "plan $name: stopped at its failed step"
  done
}
grid=()   # every plan of the grids run, in order (the table's rows)
for g in "${grid_list[@]}"; do
  case "$g" in
    gpt2-small)
      grid+=("${gpt2_grid[@]}")
      run_grid "$out/gpt2-small.json" "--model gpt --preset gpt2-small --opt seq=1024" \
        "--global-batch 4 ${gpt2_precision[*]}" "${gpt2_grid[@]}" ;;
    resnet50-offload)
      grid+=("${resnet_grid[@]}")
      step profile-resnet50-b256 "$zp" profile --model resnet --preset resnet50 --batch 256 --batches 128,256 \
        --device cuda "${rounds[@]}" -o "$out/resnet50-b256.json"
      run_grid "$out/resnet50-b256.json" "--model resnet --preset resnet50" "--global-batch 256" "${resnet_grid[@]}" ;;
  esac
done

# The table: predicted against measured, per plan (torch version and GPU on top).
summarize() {
  "$python" - "$out" "$torch_version" "$gpu" "${grid[@]%%:*}" <<'PY'
import json, os, sys
out, torch, gpu, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print(f"Measured on {gpu} with torch {torch} (scripts/gpu-check.sh)\n")
print("| plan | predicted step (ms) | measured step (ms) | error | predicted device peak (GiB) | measured device peak (GiB) "
      "| predicted host blocks (GiB) | measured host blocks (GiB) | verdict |")
print("|---|---|---|---|---|---|---|---|---|")
for n in names:
    try:
        p = json.load(open(os.path.join(out, f"prediction-{n}.json")))
        c = json.load(open(os.path.join(out, f"comparison-{n}.json")))
    except OSError:
        print(f"| {n} | | | | | | | | not run |"); continue
    rows = {m.get("name"): m for m in c.get("metrics", [])}
    step = rows.get("step_time_s", {})
    peak = rows.get("device_peak_bytes.rank0", {})
    # Host: the pinned blocks the caching host allocator held (rounded, cached) against the simulated
    # host total; the requested peak when the run recorded no blocks.
    host = rows.get("host_reserved_bytes.rank0", rows.get("host_peak_bytes.rank0", {}))
    ph = p.get("host", {})
    g = 2 ** 30
    nan = float("nan")
    print(f"| {n} | {1e3 * p['step_time_s']:.1f} | {1e3 * step.get('measured', nan):.1f} | "
          f"{100 * step.get('rel_error', nan):+.1f}% | {p['device']['peak_bytes'] / g:.2f} | "
          f"{peak.get('measured', nan) / g:.2f} | "
          f"{(ph.get('peak_bytes', 0) + ph.get('allocator_overhead_bytes', 0)) / g:.2f} | "
          f"{host.get('measured', nan) / g:.2f} | {c.get('verdict', '')} |")
# What `probe --device cuda` measured of the device (absent when it failed and the fallback ran).
try:
    cl = json.load(open(os.path.join(out, "cluster.json")))
except (OSError, ValueError):
    cl = {}
prov = cl.get("provenance", {})
rows = [("device copy, read + write", "device.mem_bw_achieved_bytes_per_s", 1e-12, "TB/s"),
        ("launch (dispatch) per kernel", "device.launch_overhead_s", 1e6, "us"),
        ("host to device, pinned", "host.bw_h2d_pinned_bytes_per_s", 1e-9, "GB/s"),
        ("device to host, pinned", "host.bw_d2h_pinned_bytes_per_s", 1e-9, "GB/s"),
        ("host to device, pageable", "host.bw_h2d_pageable_bytes_per_s", 1e-9, "GB/s"),
        ("device to host, pageable", "host.bw_d2h_pageable_bytes_per_s", 1e-9, "GB/s")]
if prov.get("device.mem_bw_achieved_bytes_per_s", {}).get("source") == "probe":
    print(f"\nThe device as `zeroplan probe --device cuda` measured it ({cl.get('name', '')}):\n")
    print("| what | measured |")
    print("|---|---|")
    for label, path, scale, unit in rows:
        section, key = path.split(".", 1)
        v = cl.get(section, {}).get(key)
        if v is not None:
            print(f"| {label} | {v * scale:.2f} {unit} |")
    gemm = prov.get("device.gemm.efficiency", {})
    if gemm.get("source") == "probe":
        print(f"| GEMMs (m = n = k) | {gemm.get('citation', '').split(': ', 1)[-1]} |")
        for dtype, buckets in cl.get("device", {}).get("gemm", {}).get("efficiency", {}).items():
            fitted = ", ".join(f"{b['efficiency']:.2f} from m,n,k >= {b['m_min']},{b['n_min']},{b['k_min']}" for b in buckets)
            print(f"| fitted {dtype} buckets | {fitted} |")
PY
}
if ((dry_run)); then
  say "step summary                      (reads every prediction and comparison into $out/summary.md)"
  # A configure into a scratch folder, when it is cheap here (a Python with torch and CMake present).
  # (GPU_CHECK_NO_CONFIGURE=1 leaves it out: the dry-run test configures once, not once per case.)
  if [ -z "${GPU_CHECK_NO_CONFIGURE:-}" ] && have cmake && [ "$torch_version" != none ]; then
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
rc=0
if ((${#failed[@]})); then
  say "failed steps: ${failed[*]}"
  rc=2
fi
if ((${#skipped[@]})); then
  say "skipped at the deadline: ${skipped[*]}"
  ((rc)) || rc=4
fi
((rc)) || say "all steps passed; results in $out"
if [ -n "$bundle" ]; then
  mkdir -p "$bundle" && cp "$out/summary.md" "$out/log.txt" "$out/versions.txt" "$bundle/" &&
    tar -czf "$bundle/gpu-check.tgz" -C "$(dirname "$out")" "$(basename "$out")" &&
    say "bundled summary.md, log.txt, versions.txt and gpu-check.tgz into $bundle" ||
    { say "could not bundle into $bundle"; ((rc)) || rc=2; }
fi
exit $rc
