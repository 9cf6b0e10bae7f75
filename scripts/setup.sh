#!/usr/bin/env bash
# zeroplan set-up: from a fresh clone to a built `build/zeroplan`, on Debian with PyPI reachable.
#   1. Debian packages (compiler, CMake, Boost.Graph, nlohmann_json, CLI11, fmt, GoogleTest, Google
#      Benchmark, gloo headers), installed only when missing;
#   2. the pinned torch wheel (requirements.txt) into .venv, reused when it already satisfies the pins;
#   3. configure and build the zeroplan binary with CMake + Ninja into build/ (incremental on later runs).
# Environment: ZEROPLAN_BUILD_DIR (default build), ZEROPLAN_JOBS (default nproc).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build_dir=${ZEROPLAN_BUILD_DIR:-build}
jobs=${ZEROPLAN_JOBS:-$(nproc)}
say() { printf '[setup] %s\n' "$*" >&2; }

debian_packages=(g++ cmake ninja-build ccache pkg-config python3-venv
  libboost-graph-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev)
missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python - <<'PY' 2>/dev/null
import sys, importlib.metadata as md
for line in open("requirements.txt"):
    line = line.split("#")[0].strip()
    if not line: continue
    name, ver = line.split("==")
    if md.version(name) != ver: sys.exit(1)
PY
then
  say "installing the pinned Python packages (torch wheel, a few GB the first time)"
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
fi

say "configuring and building into $build_dir ($jobs jobs)"
# -O2 without debug information: a fifth less compile time than RelWithDebInfo, the same code (scripts/gpu-check.sh
# and a hand-made build folder keep RelWithDebInfo for debugging).
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" >/dev/null
# The binary only (the first result sooner); scripts/test.sh builds the tests and benchmarks after it.
cmake --build "$build_dir" -j "$jobs" --target zeroplan
# The Python package (python/zeroplan) and its extension (zeroplan._C, in $build_dir/python/zeroplan):
# `import zeroplan` from .venv, with python/ on its path through a .pth file.
if grep -q '^build zeroplan_python' "$build_dir/build.ninja" 2>/dev/null ||
   cmake --build "$build_dir" --target help 2>/dev/null | grep -q zeroplan_python; then
  cmake --build "$build_dir" -j "$jobs" --target zeroplan_python
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$root/python" > "$site/.zeroplan.pth.tmp" && mv -f "$site/.zeroplan.pth.tmp" "$site/zeroplan.pth"
fi
say "ready: $build_dir/zeroplan"
