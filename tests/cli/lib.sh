# Shared by the tests/cli scripts (source it after `set -euo pipefail`):
#   cli_workdir [EXIT-COMMANDS]   a fresh folder $out, removed at exit (after EXIT-COMMANDS), made the
#                                 working directory
#   fail MESSAGE...               "FAIL: MESSAGE" and exit 1
#   expect_one_line CODE TEXT COMMAND...
#                                 runs COMMAND: it must exit CODE and print exactly one line (stdout and
#                                 stderr together) containing TEXT, never a backtrace
#   suite_cluster ZP FILE         the suite's quick probe (ZEROPLAN_TEST_CLUSTER, CTest's test.probe)
#                                 copied to FILE, or where there is none a quick probe by ZP written there
#   suite_cluster_args            cluster=(--cluster <the suite's probe>), or () where there is none (the
#                                 command then probes, as autopilot does)
cli_workdir() {
  out=$(mktemp -d)
  # shellcheck disable=SC2064  # expanded now: the folder of this script
  trap "${1:-true}; rm -rf '$out'" EXIT
  cd "$out"
}

fail() { echo "FAIL: $*"; exit 1; }

expect_one_line() {
  local code=$1 want=$2; shift 2
  set +e
  local msg; msg=$("$@" 2>&1); local rc=$?
  set -e
  echo "$msg"
  [ "$rc" -eq "$code" ] || fail "$*: exit $rc, expected $code"
  [ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] || fail "$*: more than one line"
  case "$msg" in *"frame #"*) fail "$*: a backtrace" ;; esac
  case "$msg" in *"$want"*) ;; *) fail "$*: message: $msg (expected it to contain: $want)" ;; esac
}

suite_cluster() {
  if [ -s "${ZEROPLAN_TEST_CLUSTER:-}" ]; then
    cp "$ZEROPLAN_TEST_CLUSTER" "$2"
  else
    "$1" -q probe --quick -o "$2" || fail "probe"
  fi
}

suite_cluster_args() {
  cluster=()
  if [ -s "${ZEROPLAN_TEST_CLUSTER:-}" ]; then cluster=(--cluster "$ZEROPLAN_TEST_CLUSTER"); fi
}
