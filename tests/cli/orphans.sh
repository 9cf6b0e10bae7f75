#!/usr/bin/env bash
# Ranks die with their launcher (issue #37): SIGKILL (which the launcher cannot pass on) and SIGUSR1 to
# `run --nproc 2` leave no rank running a second later (they trained on for 27-30 s with parent 1 before);
# so does SIGKILL to torchrun (its ranks are zeroplan's, started with --no-python); a launcher (or its whole
# process group) killed while its ranks checkpoint every step leaves a checkpoint that resumes; a rank whose
# agent store dies (its launcher not its parent) stops by itself.
#   orphans.sh ZEROPLAN PYTHON
set -uo pipefail
zp=$1; py=$2
torchrun=$(dirname "$py")/torchrun
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
export TMPDIR=$out/tmp OMP_NUM_THREADS=1
mkdir -p "$TMPDIR"
cd "$out"
fail() { echo "FAIL: $*"; exit 1; }

# kill_launcher SIG WHAT COMMAND...: starts COMMAND (a launcher of 2 ranks) in the background, sends SIG to
# it once both ranks train (to its whole process group when SIG starts with "-": COMMAND then runs under
# setsid), and fails unless both ranks are gone within 2 s.
kill_launcher() {
  local sig=$1 what=$2 target; shift 2
  if [ "${sig:0:1}" = - ]; then setsid "$@" 2>"$out/stderr" & else "$@" 2>"$out/stderr" & fi
  local launcher=$!
  if [ "${sig:0:1}" = - ]; then sig=${sig:1}; target=-$launcher; else target=$launcher; fi
  local ranks=()
  for _ in $(seq 1 300); do  # up to 30 s for both ranks to start and train
    mapfile -t ranks < <(pgrep -P "$launcher")
    [ "${#ranks[@]}" -eq 2 ] && grep -q 'MASTER_PORT' "/proc/${ranks[0]}/environ" 2>/dev/null && break
    sleep 0.1
  done
  [ "${#ranks[@]}" -eq 2 ] || { kill -9 "$launcher"; cat "$out/stderr"; fail "$what did not start 2 ranks"; }
  sleep 2
  kill "-$sig" -- "$target"
  wait "$launcher" 2>/dev/null
  local alive=()
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
    fail "SIG$sig to $what left ranks ${alive[*]} running"
  fi
  echo "ok: SIG$sig to $what ended both ranks"
}

gpt=(--model gpt --preset gpt2-tiny --steps 100000)
for sig in KILL USR1; do  # (a background job of a script ignores SIGQUIT and SIGINT)
  kill_launcher "$sig" "the launcher" "$zp" -q run --nproc 2 "${gpt[@]}"
done
kill_launcher KILL torchrun "$torchrun" --standalone --nproc-per-node 2 --no-python "$zp" -q run "${gpt[@]}"

# A rank whose launcher is not its parent (PR_SET_PDEATHSIG does not reach it) notices that the agent store
# it joined is gone: it stops within a few heartbeats, exit 3, one line.
"$py" - "$zp" <<'PY' || fail "a rank outlived its agent store"
import os, signal, subprocess, sys, time
from torch.distributed import TCPStore
server = subprocess.Popen([sys.executable, "-c", """
import sys, time
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(s.port, flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
port = int(server.stdout.readline())
env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
           MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="orphan-test")
rank = subprocess.Popen([sys.argv[1], "-q", "run", "--model", "gpt", "--preset", "gpt2-tiny", "--steps", "100000"],
                        env=env, stderr=subprocess.PIPE, text=True)
time.sleep(4)
assert rank.poll() is None, f"the rank ended early: {rank.returncode} {rank.stderr.read()}"
server.kill(); server.wait()
t0 = time.time()
try:
    rank.wait(timeout=15)
except subprocess.TimeoutExpired:
    rank.kill(); print("the rank trained on 15 s after its agent store died"); sys.exit(1)
err = rank.stderr.read().strip()
print(f"rank ended {time.time() - t0:.1f} s after its store, exit {rank.returncode}: {err}")
# torch's TCPStore warns of the broken pipe on a line of its own before it; no backtrace
sys.exit(0 if rank.returncode == 3 and "is gone, so its launcher" in err.splitlines()[-1] and "frame #" not in err else 1)
PY

# Killed while checkpointing every step: what is left resumes (a save cut short has no manifest).
kill_launcher -KILL "the whole group saving every step" "$zp" -q run --nproc 2 "${gpt[@]}" --checkpoint-dir ck \
  --checkpoint-every 1 --checkpoint-keep 2
"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --steps 1 --warmup 0 --resume ck -o resumed.json \
  || fail "the checkpoint left by the killed group does not resume"
kill_launcher KILL "the launcher saving every step" "$zp" -q run --nproc 2 "${gpt[@]}" --checkpoint-dir ck \
  --checkpoint-every 1 --checkpoint-keep 2
ls ck
"$zp" -q run --nproc 2 --model gpt --preset gpt2-tiny --steps 1 --warmup 0 --resume ck -o resumed.json \
  || fail "the checkpoint left by the killed launcher does not resume"
echo "orphans: ok"
