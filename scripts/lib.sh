# Shared settings for the scripts. Sourced, not run.
# Everything the scripts install or start lives under $SHAREFLOW_HOME, so a second run
# reuses it (and works offline once installed).
SHAREFLOW_HOME="${SHAREFLOW_HOME:-$HOME/.cache/shareflow}"
SHAREFLOW_BIN="$SHAREFLOW_HOME/bin"
SHAREFLOW_RUN="$SHAREFLOW_HOME/run"
mkdir -p "$SHAREFLOW_BIN" "$SHAREFLOW_RUN"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Waits until "$@" succeeds, up to $1 seconds.
wait_for() {
  local seconds=$1; shift
  local i
  for ((i = 0; i < seconds * 10; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  return 1
}

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
