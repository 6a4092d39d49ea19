#!/usr/bin/env bash
# Runs libmember locally: PostgreSQL on 127.0.0.1:5433 (data kept in .data/pg) and
# valkey-server on 127.0.0.1:6380 with target/release/libmember.so (see module.conf).
#   bash scripts/run-local.sh        start both (each only if not already running)
#   bash scripts/run-local.sh stop   stop both
#   bash scripts/run-local.sh pg     start PostgreSQL only (scripts/cluster-local.sh uses it)
# `make run` builds the module first; `make stop` stops. PG=16|17|18 (`make run PG=18`) runs
# the local database on that major instead of Debian's 15, from the pinned binaries
# scripts/postgres.sh unpacks under target/ (data in .data/pg<major>); one major at a time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DATA="$ROOT/.data"
PGDATA="$DATA/pg"
PGLOG="$DATA/pg.log"
PG_PORT=5433
VK_PORT=6380
PG_BIN_DIR=""
case "${PG:-}" in
  ""|15) ;;
  16|17|18)
    PG_BIN_DIR="$(bash "$ROOT/scripts/postgres.sh" "$PG")"
    PGDATA="$DATA/pg$PG"
    PGLOG="$DATA/pg$PG.log"
    ;;
  *) echo "PG=$PG: the local database runs 15 (Debian's, the default), 16, 17 or 18" >&2; exit 1 ;;
esac

# The binary `$1` of the major this run uses: a pinned one (PG=16-18), else Debian's newest.
pg_bin() {
  local p
  if [ -n "$PG_BIN_DIR" ]; then echo "$PG_BIN_DIR/$1"; return; fi
  p=$(ls -d /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n1 || true)
  if [ -n "$p" ]; then echo "$p"; else command -v "$1"; fi
}
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres -- "$@"; fi
}
pg_ctl() { as_pg "$(pg_bin pg_ctl)" "$@"; }
# pg_ctl of the major that made data dir `$1` (any run's: `stop` stops whichever runs).
pg_ctl_of() {
  local major bin
  major=$(cat "$1/PG_VERSION")
  if [ -x "/usr/lib/postgresql/$major/bin/pg_ctl" ]; then bin="/usr/lib/postgresql/$major/bin"
  else bin="$(bash "$ROOT/scripts/postgres.sh" "$major")"; fi
  as_pg "$bin/pg_ctl" -D "$1" "${@:2}"
}
vk_up() { [ "$(valkey-cli -p "$VK_PORT" ping 2>/dev/null)" = "PONG" ]; }
# The data dirs of every major `make run` has started here.
pg_dirs() { for d in "$DATA"/pg "$DATA"/pg1[0-9]; do [ -f "$d/PG_VERSION" ] && echo "$d"; done; true; }

if [ "${1:-}" = "stop" ]; then
  if vk_up; then valkey-cli -p "$VK_PORT" shutdown nosave >/dev/null 2>&1 || true; echo "valkey stopped"; fi
  for d in $(pg_dirs); do
    if pg_ctl_of "$d" status >/dev/null 2>&1; then pg_ctl_of "$d" -m fast -w stop; fi
  done
  exit 0
fi
# One local database at a time: they share port 5433.
for d in $(pg_dirs); do
  if [ "$d" != "$PGDATA" ] && pg_ctl_of "$d" status >/dev/null 2>&1; then
    echo "PostgreSQL $(cat "$d/PG_VERSION") already runs on port $PG_PORT from $d: 'make stop' first" >&2
    exit 1
  fi
done

if [ "${1:-}" != "pg" ] && [ ! -f target/release/libmember.so ]; then
  echo "target/release/libmember.so is missing: run 'make run' (or cargo build --release)" >&2
  exit 1
fi

mkdir -p "$DATA"
# postgres must be able to reach .data (and its parents) and write its log there.
chmod 755 "$DATA"
if ! as_pg test -x "$DATA"; then
  echo "run-local: the postgres user cannot enter $DATA: a directory above it is closed to" \
       "others (a checkout under /root or a mktemp -d is 0700); clone under /srv, /opt or /tmp" >&2
  exit 1
fi
touch "$PGLOG" && chown postgres:postgres "$PGLOG"

# --- PostgreSQL -------------------------------------------------------------------------------
if [ ! -f "$PGDATA/PG_VERSION" ]; then
  rm -rf "$PGDATA"
  install -d -m 700 -o postgres -g postgres "$PGDATA"
  as_pg "$(pg_bin initdb)" -D "$PGDATA" -A trust -U postgres -E UTF8 >/dev/null
fi
chown -R postgres:postgres "$PGDATA"
if pg_ctl -D "$PGDATA" status >/dev/null 2>&1; then
  echo "PostgreSQL already running on port $PG_PORT"
else
  pg_ctl -D "$PGDATA" -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1" -l "$PGLOG" -w start \
    || { tail -n 30 "$PGLOG" >&2; exit 1; }
fi

[ "${1:-}" = "pg" ] && exit 0

# --- Valkey -----------------------------------------------------------------------------------
if vk_up; then
  echo "valkey already answering on port $VK_PORT (restart with 'make stop && make run' to load a new build)"
else
  valkey-server module.conf --daemonize yes
  for _ in $(seq 100); do vk_up && break; sleep 0.1; done
  if ! vk_up; then
    echo "valkey-server did not start; tail of .data/valkey.log:" >&2
    tail -n 30 "$DATA/valkey.log" >&2 || true
    exit 1
  fi
fi

cat <<MSG

libmember is running.
  Valkey:      valkey-cli -p $VK_PORT          (log: .data/valkey.log)
  PostgreSQL:  psql "host=127.0.0.1 port=$PG_PORT user=postgres"   (log: ${PGLOG#"$ROOT/"})

Example session:
  \$ valkey-cli -p $VK_PORT
  127.0.0.1:$VK_PORT> MEMBER.CREATE users NORMALIZE username
  127.0.0.1:$VK_PORT> MEMBER.ADD users alice
  127.0.0.1:$VK_PORT> MEMBER.EXISTS users Alice

Stop both with: make stop
MSG
