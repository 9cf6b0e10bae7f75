#!/usr/bin/env bash
# The two programs of the command line (cli/src/app.h): `zeroplan` links no torch and serves simulate,
# tune, compare, calibrate and plan itself; everything else goes to zeroplan-torch beside it with the
# same arguments (its help lists the models, its exit codes and lines are the same); a `zeroplan`
# without its torch half still plans, and refuses the rest in one line with exit 2.
#   front.sh ZEROPLAN
set -uo pipefail
zp=$1
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }
# No torch library among what the front loads (what keeps it fast; not timed here). Long outputs are
# captured before grep -q reads them: `cmd | grep -q` under pipefail fails when grep's early exit cuts the
# writer off (SIGPIPE), now and then under load (seen once in a -j2 run).
if ldd "$zp" | grep -Eq 'libtorch|libc10'; then fail "$zp links torch: $(ldd "$zp" | grep -E 'libtorch|libc10' | tr '\n' ' ')"; fi
libs=$(ldd "$(dirname "$zp")/zeroplan-torch")
grep -q libtorch_cpu <<<"$libs" || fail "zeroplan-torch does not link libtorch_cpu"
# Served here and there alike: the same document from both programs.
"$zp" -q plan --fields >"$out/front.txt" 2>&1 || fail "plan --fields exited $?"
"$(dirname "$zp")/zeroplan-torch" -q plan --fields >"$out/torch.txt" 2>&1 || fail "zeroplan-torch plan --fields exited $?"
cmp -s "$out/front.txt" "$out/torch.txt" || fail "plan --fields differs between zeroplan and zeroplan-torch"
# Handed over: --help lists the built-in models (only the torch half knows them), --version names torch.
help=$("$zp" --help 2>&1)
grep -q 'Models (--model NAME' <<<"$help" || fail "zeroplan --help does not list the models"
help=$("$zp" simulate --help 2>&1)
grep -q 'Models (--model NAME' <<<"$help" || fail "zeroplan simulate --help does not list the models"
version=$("$zp" --version 2>&1)
grep -Eq '^[0-9.]+ \(torch [0-9]' <<<"$version" || fail "zeroplan --version: $version"
# A bad option of a served subcommand: one line, exit 1, as ever.
"$zp" tune --top-k 0 >"$out/stdout" 2>"$out/stderr"; rc=$?
[ "$rc" = 1 ] && [ "$(grep -c '' "$out/stderr")" = 1 ] || fail "tune --top-k 0: exit $rc: $(cat "$out/stderr")"
# Without the torch half: planning works, the rest exits 2 naming what is missing.
mkdir -p "$out/alone"
cp "$zp" "$out/alone/zeroplan"
"$out/alone/zeroplan" -q plan --fields >/dev/null 2>&1 || fail "plan --fields without the torch half"
"$out/alone/zeroplan" -q run --model mlp --steps 1 >"$out/stdout" 2>"$out/stderr"; rc=$?
if [ "$rc" != 2 ] || [ "$(grep -c '' "$out/stderr")" != 1 ] ||
   ! grep -q "^zeroplan run: needs $out/alone/zeroplan-torch (the torch half of zeroplan)" "$out/stderr"; then
  fail "run without the torch half: exit $rc: $(cat "$out/stderr")"
fi
[ "$status" = 0 ] && echo "ok"
exit $status
