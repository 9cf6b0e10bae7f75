#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a GPU machine without network: the Debian packages of the
# headers and small libraries zeroplan builds against (nlohmann_json, fmt, Boost headers, CLI11,
# GoogleTest, Google Benchmark, gloo headers), as .deb files that gpu-check.sh --debs unpacks into its
# build folder (never into /). Run it here, where Debian's archive is reachable; the folder then travels
# with the working tree (the device tool's `carry`, 64 MiB in all).
#
#   scripts/gpu-kit-pack.sh [DIR]      default DIR: .gpu-kit/debs (ignored by git)
# Exit: 0 packed (the total size is printed); 1 apt-get could not download a package; 3 the packages
# came out larger than the 40 MiB this kit leaves them (the tree and its results need the rest).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/.gpu-kit/debs}
limit_bytes=$((40 << 20))
# Headers and the libraries behind them. Boost.Graph is header-only for what the simulator uses, and
# its headers are in libboost1.74-dev with Boost's CMake config; libfmt9 and libbenchmark1debian are the
# shared libraries that libfmt-dev and libbenchmark-dev link to.
packages=(nlohmann-json3-dev libfmt-dev libfmt9 libboost1.74-dev libcli11-dev libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian libgloo-dev)
mkdir -p "$dir"
rm -f "$dir"/*.deb
if ! (cd "$dir" && apt-get download -q "${packages[@]}" >/dev/null 2>"$dir/../apt.log"); then
  echo "gpu-kit-pack: apt-get download failed ($(tail -1 "$dir/../apt.log")); run 'apt-get update' first" >&2
  exit 1
fi
bytes=$(du -cb "$dir"/*.deb | tail -1 | cut -f1)
echo "gpu-kit-pack: ${#packages[@]} packages, $((bytes >> 20)) MiB in $dir"
if ((bytes > limit_bytes)); then
  echo "gpu-kit-pack: $bytes bytes of packages exceed the kit's $limit_bytes (the device tool carries 64 MiB with the tree)" >&2
  exit 3
fi
