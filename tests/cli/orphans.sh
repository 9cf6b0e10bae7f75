#!/usr/bin/env bash
# Ranks die with their launcher (issue #37): SIGKILL (which the launcher cannot pass on) and SIGUSR1 to
# `run --nproc 2` leave no rank running a second later (they trained on for 27-30 s with parent 1 before).
#   orphans.sh ZEROPLAN
set -uo pipefail
zp=$1
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
export TMPDIR=$out/tmp OMP_NUM_THREADS=1
mkdir -p "$TMPDIR"
fail() { echo "FAIL: $*"; exit 1; }
for sig in KILL USR1; do  # (a background job of a script ignores SIGQUIT and SIGINT)
  "$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --steps 100000 2>"$out/stderr" &
  launcher=$!
  ranks=()
  for _ in $(seq 1 200); do  # up to 20 s for both ranks to start and train
    mapfile -t ranks < <(pgrep -P "$launcher")
    [ "${#ranks[@]}" -eq 2 ] && grep -q 'MASTER_PORT' "/proc/${ranks[0]}/environ" 2>/dev/null && break
    sleep 0.1
  done
  [ "${#ranks[@]}" -eq 2 ] || fail "the launcher did not start 2 ranks"
  sleep 1
  kill "-$sig" "$launcher"
  wait "$launcher" 2>/dev/null
  alive=()
  for _ in $(seq 1 20); do  # up to 2 s
    alive=()
    # a killed rank waits as a zombie until its new parent reaps it: only running ones count
    for r in "${ranks[@]}"; do
      state=$(awk '{print $3}' "/proc/$r/stat" 2>/dev/null) || continue
      [ "$state" != Z ] && [ "$state" != X ] && alive+=("$r")
    done
    [ "${#alive[@]}" -eq 0 ] && break
    sleep 0.1
  done
  if [ "${#alive[@]}" -ne 0 ]; then
    kill -9 "${alive[@]}" 2>/dev/null
    fail "SIG$sig to the launcher left ranks ${alive[*]} running"
  fi
  echo "ok: SIG$sig to the launcher ended both ranks"
done
echo "orphans: ok"
