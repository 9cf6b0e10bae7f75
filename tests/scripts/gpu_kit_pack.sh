#!/usr/bin/env bash
# scripts/gpu-kit-pack.sh on a stand-in apt-get (no download in tests): every package asked for lands in
# the folder, the total is printed, stale .deb files are replaced, more than 40 MiB exits 3, and a failing
# download exits 1 with one line.
#   gpu_kit_pack.sh SCRIPT
set -euo pipefail
pack=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$tmp/bin"
cat >"$tmp/bin/apt-get" <<'SH'
#!/usr/bin/env bash
# apt-get download NAME...: a file NAME_1_amd64.deb of FAKE_DEB_KIB KiB each; FAKE_APT_FAIL: refuse.
[ "$1" = download ] || exit 100
shift
[ "$1" = -q ] && shift
[ -n "${FAKE_APT_FAIL:-}" ] && { echo "E: Unable to locate package $1" >&2; exit 100; }
for p in "$@"; do head -c "$((${FAKE_DEB_KIB:-100} * 1024))" /dev/zero >"${p}_1_amd64.deb"; done
SH
chmod +x "$tmp/bin/apt-get"
export PATH="$tmp/bin:$PATH"

mkdir -p "$tmp/debs" && touch "$tmp/debs/stale_0_amd64.deb"
FAKE_DEB_KIB=1024 "$pack" "$tmp/debs" >"$tmp/out" 2>&1 || fail "exit $? ($(cat "$tmp/out"))"
grep -q '^gpu-kit-pack: 10 packages, 10 MiB in ' "$tmp/out" || fail "no total: $(cat "$tmp/out")"
for p in nlohmann-json3-dev libfmt-dev libfmt9 libboost1.74-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev \
         libbenchmark1debian libgloo-dev; do
  [ -s "$tmp/debs/${p}_1_amd64.deb" ] || fail "$p was not packed"
done
[ ! -e "$tmp/debs/stale_0_amd64.deb" ] || fail "a stale .deb was kept"

set +e
FAKE_DEB_KIB=5000 "$pack" "$tmp/big" >"$tmp/out" 2>&1; rc=$?
[ "$rc" = 3 ] || fail "50 MiB of packages exited $rc, not 3"
grep -q "exceed the kit's 41943040" "$tmp/out" || fail "the size error does not give the numbers: $(cat "$tmp/out")"
FAKE_APT_FAIL=1 "$pack" "$tmp/none" >"$tmp/out" 2>&1; rc=$?
set -e
[ "$rc" = 1 ] || fail "a failed download exited $rc, not 1"
[ "$(grep -c '' "$tmp/out")" = 1 ] && grep -q "apt-get download failed (E: Unable to locate package" "$tmp/out" ||
  fail "a failed download: $(cat "$tmp/out")"
echo ok
