#!/usr/bin/env bash
# A local Valkey Cluster with the module: 3 primaries and 3 replicas on 127.0.0.1:7001-7006
# (cluster bus 17001-17006, loopback only), data in .data/c700N, its own database
# `member_cluster` on the PostgreSQL of `make run` (127.0.0.1:5433), so its sets are not the
# standalone server's.
#   bash scripts/cluster-local.sh        start (returns once every node serves MEMBER.*)
#   bash scripts/cluster-local.sh stop   stop the nodes and remove their data
# `make cluster` builds the module first; `make cluster-stop` stops.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PORTS=(7001 7002 7003 7004 7005 7006)
PG_PORT=5433

up() { [ "$(valkey-cli -p "$1" ping 2>/dev/null)" = "PONG" ]; }

if [ "${1:-}" = "stop" ]; then
  for p in "${PORTS[@]}"; do
    if up "$p"; then valkey-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; fi
  done
  rm -rf .data/c700?
  echo "cluster stopped"
  exit 0
fi

if [ ! -f target/release/libmember.so ]; then
  echo "target/release/libmember.so is missing: run 'make cluster' (or cargo build --release)" >&2
  exit 1
fi
for p in "${PORTS[@]}"; do
  if up "$p"; then
    echo "port $p already answers: 'make cluster-stop' first" >&2
    exit 1
  fi
done

bash scripts/run-local.sh pg
psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc \
  "SELECT 1 FROM pg_database WHERE datname = 'member_cluster'" | grep -q 1 \
  || psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -qc 'CREATE DATABASE member_cluster'

for p in "${PORTS[@]}"; do
  rm -rf ".data/c$p"
  mkdir -p ".data/c$p"
  valkey-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --dir ".data/c$p" \
    --logfile valkey.log --daemonize yes \
    --loadmodule "$ROOT/target/release/libmember.so" \
    --member.pg-url "host=127.0.0.1 port=$PG_PORT user=postgres dbname=member_cluster"
done
for p in "${PORTS[@]}"; do
  for _ in $(seq 100); do up "$p" && break; sleep 0.1; done
  up "$p" || { echo "node $p did not start; tail of .data/c$p/valkey.log:" >&2; tail -n 20 ".data/c$p/valkey.log" >&2; exit 1; }
done

valkey-cli --cluster create "${PORTS[@]/#/127.0.0.1:}" --cluster-replicas 1 --cluster-yes >/dev/null
# Every node must see the cluster up and have read the module's catalog before the first call.
for p in "${PORTS[@]}"; do
  ok=""
  for _ in $(seq 600); do
    if valkey-cli -p "$p" CLUSTER INFO | grep -q '^cluster_state:ok' \
      && valkey-cli -p "$p" INFO member | grep -q '^member_catalog_loaded:1'; then
      ok=1
      break
    fi
    sleep 0.1
  done
  [ -n "$ok" ] || { echo "node $p is not ready after 60 s; tail of .data/c$p/valkey.log:" >&2; tail -n 20 ".data/c$p/valkey.log" >&2; exit 1; }
done

cat <<MSG

A local cluster is running: primaries 127.0.0.1:7001-7003, replicas 7004-7006
(logs: .data/c700N/valkey.log), database member_cluster on 127.0.0.1:$PG_PORT.
  \$ valkey-cli -c -p 7001 MEMBER.CREATE users NORMALIZE username
  \$ valkey-cli -c -p 7001 MEMBER.ADD users alice
  \$ valkey-cli -c -p 7002 MEMBER.EXISTS users ALICE

Stop it with: make cluster-stop
MSG
