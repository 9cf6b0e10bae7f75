# Shared by the tests/cli scripts (source it after `set -euo pipefail`):
#   cli_workdir [EXIT-COMMANDS]   a fresh folder $out, removed at exit (after EXIT-COMMANDS), made the
#                                 working directory
#   fail MESSAGE...               "FAIL: MESSAGE" and exit 1
#   expect_one_line CODE TEXT COMMAND...
#                                 runs COMMAND: it must exit CODE and print exactly one line (stdout and
#                                 stderr together) containing TEXT, never a backtrace
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
