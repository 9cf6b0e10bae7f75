#!/usr/bin/env bash
# The `run --nproc` launcher under SIGTERM, and its store:
#   while its 2 ranks train, the store answers on 127.0.0.1 and not on this machine's other addresses;
#   SIGTERM to the launcher stops both ranks within the grace period, leaves no zeroplan-run-* folder in
#   TMPDIR, exits 143 with one line; a normal run leaves no folder either.
#   signals.sh ZEROPLAN
set -uo pipefail
zp=$1
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
export TMPDIR=$out/tmp OMP_NUM_THREADS=1
mkdir -p "$TMPDIR"
fail() { echo "FAIL: $*"; exit 1; }
"$zp" -q run --nproc 2 --model mlp --preset mlp-tiny --steps 2 --warmup 1 -o "$out/ok.json" || fail "a normal run"
[ -z "$(ls -A "$TMPDIR")" ] || fail "a normal run left $(ls "$TMPDIR") in TMPDIR"
echo "ok: a normal run leaves nothing in TMPDIR"

"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --steps 100000 2>"$out/stderr" &
launcher=$!
ranks=()
for _ in $(seq 1 200); do  # up to 20 s for both ranks to start and train
  mapfile -t ranks < <(pgrep -P "$launcher")
  [ "${#ranks[@]}" -eq 2 ] && grep -q 'MASTER_PORT' "/proc/${ranks[0]}/environ" 2>/dev/null && break
  sleep 0.1
done
[ "${#ranks[@]}" -eq 2 ] || fail "the launcher did not start 2 ranks"
port=$(tr '\0' '\n' <"/proc/${ranks[0]}/environ" | sed -n 's/^MASTER_PORT=//p')
[ -n "$port" ] || fail "no MASTER_PORT in rank 0's environment"
(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || fail "the store does not answer on 127.0.0.1:$port"
echo "ok: the store answers on 127.0.0.1:$port"
others=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -v '^127\.' | grep -v ':' | grep -v '^$' || true)
if [ -z "$others" ]; then
  echo "note: this machine has no non-loopback IPv4 address; reachability from one not checked"
fi
for ip in $others; do
  if (exec 3<>"/dev/tcp/$ip/$port") 2>/dev/null; then fail "the store answers on $ip:$port"; fi
  echo "ok: the store does not answer on $ip:$port"
done
sleep 1
kill -TERM "$launcher"
wait "$launcher"; code=$?
for pid in "${ranks[@]}"; do
  [ ! -e "/proc/$pid" ] || [ "$(awk '{print $3}' "/proc/$pid/stat")" = Z ] || fail "rank pid $pid still runs after the launcher ended"
done
[ "$code" -eq 143 ] || fail "launcher exit $code after SIGTERM, expected 143 (stderr: $(cat "$out/stderr"))"
[ "$(grep -c '' "$out/stderr")" -eq 1 ] || fail "stderr is not one line: $(cat "$out/stderr")"
grep -q 'stopped by SIGTERM: the 2 ranks were stopped' "$out/stderr" || fail "message: $(cat "$out/stderr")"
grep -q 'frame #' "$out/stderr" && fail "a backtrace"
[ -z "$(ls -A "$TMPDIR")" ] || fail "SIGTERM left $(ls "$TMPDIR") in TMPDIR"
echo "ok: SIGTERM -> exit 143, one line ($(cat "$out/stderr")), no rank and no folder left"
