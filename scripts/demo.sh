#!/usr/bin/env bash
# The sign-up example (examples/signup) on top of what scripts/run-local.sh starts:
# allows its table to be attached (member.attach-allow), starts app.py in the background on
# 127.0.0.1:${DEMO_PORT:-8080} (log .data/signup.log) and prints the URL.
#   bash scripts/demo.sh        start it (`make demo` starts the servers first)
#   bash scripts/demo.sh stop   stop it (`make stop` does, with the servers)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DATA="$ROOT/.data"
PID="$DATA/signup.pid"
LOG="$DATA/signup.log"
PORT="${DEMO_PORT:-8080}"
VK_PORT=6380

running() { [ -f "$PID" ] && kill -0 "$(cat "$PID")" 2>/dev/null; }

if [ "${1:-}" = "stop" ]; then
  if running; then kill "$(cat "$PID")"; echo "sign-up example stopped"; fi
  rm -f "$PID"
  exit 0
fi

if running; then
  echo "sign-up example already running: http://127.0.0.1:$PORT/ (stop it with: make stop)"
  exit 0
fi

# Attaching a table is the operator's decision: add the example's table to the list.
allowed=$(valkey-cli -p "$VK_PORT" --raw CONFIG GET member.attach-allow | sed -n 2p)
case " ${allowed//,/ } " in
  *" signup.users "*) ;;
  *) valkey-cli -p "$VK_PORT" CONFIG SET member.attach-allow "${allowed:+$allowed, }signup.users" >/dev/null ;;
esac

mkdir -p "$DATA"
nohup target/pyenv/bin/python examples/signup/app.py --port "$PORT" >"$LOG" 2>&1 &
echo $! > "$PID"
for _ in $(seq 300); do
  grep -q "listening on" "$LOG" && break
  running || { cat "$LOG" >&2; rm -f "$PID"; exit 1; }
  sleep 0.1
done
grep -q "listening on" "$LOG" || { echo "app.py did not start; see $LOG" >&2; exit 1; }

cat <<MSG

The sign-up example is running: http://127.0.0.1:$PORT/
  Its table:  psql "host=127.0.0.1 port=5433 user=postgres" -c 'TABLE signup.users'
  Its log:    .data/signup.log
Stop it (and the servers) with: make stop
MSG
