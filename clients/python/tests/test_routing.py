"""Every call one hop: ``libmember.Sets`` over valkey-glide's cluster clients (sync and async),
redis-py's ``RedisCluster`` and valkey-py's ``ValkeyCluster``, on a cluster of its own
(tests/all/python_client.rs starts it, so no other test's redirections are counted), with the
MOVED replies counted from ``INFO errorstats`` on every node, primaries and replicas.

The count is shown to see a misrouted call: GLIDE's own ``custom_command`` without a route, as
an application would call it, takes a MOVED on about two calls in three.
"""

import asyncio
import time

import glide
import glide_sync
import pytest
import redis
import valkey
from glide_shared.exceptions import RequestError
from redis.cluster import RedisCluster

import libmember
import libmember.asyncio
from libmember._command import ROUTING_ARG, keyslot

# GLIDE gives up on a call after 250 ms unless told otherwise: docs/clients.md.
TIMEOUT_MS = 30_000
CALLS = 1000

# 1000 items of every kind a route is computed for: text, text with a {hash tag} (routed by the
# tag), and bytes (GLIDE takes a slot key only as text: decoded).
ITEMS = (
    [f"user-{i}" for i in range(900)]
    + [f"{{tag-{i}}}:member" for i in range(50)]
    + [f"été-{i}".encode() for i in range(50)]
)
# Bytes that are not UTF-8 go by the slot libmember computes (the server refuses such an item,
# from the node that serves its slot).
NOT_UTF8 = [b"\xff\xfe" + i.to_bytes(2, "big") for i in range(50)]
assert len(ITEMS) == CALLS


def moved(ports):
    """MOVED replies sent so far, summed over every node."""
    total = 0
    for port in ports:
        with redis.Redis(port=port) as node:
            total += node.info("errorstats").get("errorstat_MOVED", {}).get("count", 0)
    return total


class Counted:
    """MOVED sent by the cluster while the block runs."""

    def __init__(self, ports):
        self.ports = ports

    def __enter__(self):
        self.before = moved(self.ports)
        return self

    def __exit__(self, *exc):
        self.count = moved(self.ports) - self.before


def glide_sync_cluster(port):
    return glide_sync.GlideClusterClient.create(
        glide_sync.GlideClusterClientConfiguration(
            [glide_sync.NodeAddress("127.0.0.1", port)], request_timeout=TIMEOUT_MS
        )
    )


async def glide_async_cluster(port):
    return await glide.GlideClusterClient.create(
        glide.GlideClusterClientConfiguration(
            [glide.NodeAddress("127.0.0.1", port)], request_timeout=TIMEOUT_MS
        )
    )


def wait_every_primary_has_its_filter(sets, name, timeout=30.0):
    """MEMBER.INFO once each primary holds a filter of the set (the primaries that learn it
    from the catalog build theirs in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        info = sets.info(name)
        primaries = [n for n in info["nodes"] if n.get("role") == "primary"]
        if all(n.get("filter_present") is True for n in primaries):
            return info
        assert time.monotonic() < deadline, f"a primary has no filter of {name}: {primaries}"
        time.sleep(0.1)


def test_the_items_span_every_primary_and_the_slots_match_the_server(cluster_ports):
    with RedisCluster(host="127.0.0.1", port=cluster_ports[0]) as rc:
        owners = {rc.get_node_from_key(i).name for i in ITEMS}
        assert len(owners) == len(rc.get_primaries()) == 3
        # The slot libmember computes for bytes GLIDE cannot take as text is the server's.
        for item in NOT_UTF8 + [b"{}x", b"a{b}c", b"{\xff}z", b"no}{tag"]:
            assert keyslot(item) == rc.execute_command("CLUSTER KEYSLOT", item), item


def test_the_routing_arguments_are_the_servers(cluster_ports):
    """The argument the package routes each command by is the one the server declares (first
    key position in COMMAND INFO), and every public command that declares one is covered."""
    with redis.Redis(port=cluster_ports[0], decode_responses=True) as node:
        names = node.command_list(module="member")
        public = [n for n in names if not n.startswith("member._")]
        info = node.execute_command("COMMAND", "INFO", *public)
    declared = {n.upper(): i["first_key_pos"] for n, i in info.items() if i["first_key_pos"]}
    assert declared == ROUTING_ARG
    assert info["member.nodeinfo"]["first_key_pos"] == 0


def every_method(sets, name, own_error):
    """Every method across slots through one cluster client, typed as over redis-py."""
    items = [f"m-{i}" for i in range(30)]
    sets.create(name, normalize="lower", capacity=10_000, cache_ttl=300)
    assert [sets.add(name, i) for i in items] == [True] * 30
    assert [sets.exists(name, i) for i in items] == [True] * 30
    assert sets.add(name, "m-0") is False
    assert sets.exists(name, "nobody") is False
    # A spelling whose canonical form lives on another node: the server forwards it.
    assert sets.exists(name, "  M-7 ") is True
    fresh = [f"new-{i}" for i in range(12)]
    assert sets.madd(name, fresh + ["m-3"]) == [True] * 12 + [False]
    assert sets.mexists(name, fresh + ["absent"]) == [True] * 12 + [False]
    assert sets.madd(name, ["s1"], scope="t") == [True]
    assert sets.mexists(name, ["s1"], scope="t") == [True] and sets.mexists(name, ["s1"]) == [False]
    e = sets.explain(name, "m-5")
    assert e.answer is True and e.path in ("db-hit", "cache-hit"), e
    assert sets.delete(name, "m-5") is True and sets.exists(name, "m-5") is False
    sets.alter(name, cache_ttl=60)
    info = wait_every_primary_has_its_filter(sets, name)
    assert info["name"] == name and info["cache_ttl"] == 60
    assert info["cluster_nodes"] == len(info["nodes"]) == 6
    primaries = [n for n in info["nodes"] if n["role"] == "primary"]
    assert info["filter_items"] == sum(n["filter_items"] for n in primaries)
    assert sets.rebuild(name, sync=True) == 30 - 1 + 12 + 1
    with pytest.raises(libmember.NoSuchSet) as raised:
        sets.exists("route_nosuch", "x")
    assert isinstance(raised.value, own_error)
    with pytest.raises(libmember.NoSuchSet):
        sets.mexists("route_nosuch", ["x", "y"])
    sets.drop(name, delete_data=True)


def test_glide_sync_cluster_every_method(cluster_port):
    client = glide_sync_cluster(cluster_port)
    try:
        every_method(libmember.Sets(client), "route_glide_methods", RequestError)
    finally:
        client.close()


def test_valkey_py_cluster_every_method(cluster_port):
    with valkey.ValkeyCluster(host="127.0.0.1", port=cluster_port) as client:
        every_method(
            libmember.Sets(client), "route_valkey_methods", valkey.exceptions.ResponseError
        )


def one_hop(sets, name, ports):
    """1000 EXISTS, 1000 ADD, 1000 EXISTS again, a MEXISTS and a MADD of 100 and an INFO,
    each counted; returns the MOVED of each step."""
    sets.create(name, normalize="none")
    counts = {}
    with Counted(ports) as c:
        assert [sets.exists(name, i) for i in ITEMS] == [False] * CALLS
    counts["exists"] = c.count
    with Counted(ports) as c:
        assert [sets.add(name, i) for i in ITEMS] == [True] * CALLS
    counts["add"] = c.count
    with Counted(ports) as c:
        assert [sets.exists(name, i) for i in ITEMS] == [True] * CALLS
        assert sets.mexists(name, ITEMS[::10]) == [True] * 100
        assert sets.madd(name, [f"more-{i}" for i in range(100)]) == [True] * 100
        assert sets.info(name)["name"] == name
        assert sets.explain(name, ITEMS[1]).answer is True
        assert sets.delete(name, ITEMS[2]) is True
        for item in NOT_UTF8[:10]:
            with pytest.raises(Exception, match="valid UTF-8"):
                sets.exists(name, item)
    counts["rest"] = c.count
    sets.drop(name, delete_data=True)
    return counts


def report(label, counts):
    print(f"MOVED per {CALLS}: {label}: EXISTS {counts['exists']}, ADD {counts['add']}, "
          f"EXISTS of members + batches + INFO {counts['rest']}")


def test_glide_sync_cluster_one_hop(cluster_port, cluster_ports):
    client = glide_sync_cluster(cluster_port)
    try:
        counts = one_hop(libmember.Sets(client), "route_glide_sync", cluster_ports)
    finally:
        client.close()
    report("libmember.Sets over glide_sync.GlideClusterClient", counts)
    assert counts == {"exists": 0, "add": 0, "rest": 0}


def test_glide_async_cluster_one_hop(cluster_port, cluster_ports):
    async def main():
        client = await glide_async_cluster(cluster_port)
        try:
            sets = libmember.asyncio.Sets(client)
            name = "route_glide_async"
            await sets.create(name, normalize="none")
            counts = {}
            with Counted(cluster_ports) as c:
                # 100 calls in flight at a time on the one client.
                for start in range(0, CALLS, 100):
                    part = ITEMS[start : start + 100]
                    assert await asyncio.gather(*(sets.add(name, i) for i in part)) == [True] * 100
            counts["add"] = c.count
            with Counted(cluster_ports) as c:
                for start in range(0, CALLS, 100):
                    part = ITEMS[start : start + 100]
                    found = await asyncio.gather(*(sets.exists(name, i) for i in part))
                    assert found == [True] * 100
            counts["exists"] = c.count
            with Counted(cluster_ports) as c:
                assert await sets.mexists(name, ITEMS[::10]) == [True] * 100
                assert (await sets.info(name))["name"] == name
                assert await sets.rebuild(name, sync=True) == CALLS
            counts["rest"] = c.count
            with pytest.raises(libmember.NoSuchSet) as raised:
                await sets.exists("route_nosuch", "x")
            assert isinstance(raised.value, RequestError)
            await sets.drop(name, delete_data=True)
            return counts
        finally:
            await client.close()

    counts = asyncio.run(main())
    report("libmember.asyncio.Sets over glide.GlideClusterClient", counts)
    assert counts == {"exists": 0, "add": 0, "rest": 0}


def test_redis_py_cluster_one_hop(cluster_port, cluster_ports):
    with RedisCluster(host="127.0.0.1", port=cluster_port) as client:
        counts = one_hop(libmember.Sets(client), "route_redis_py", cluster_ports)
    report("libmember.Sets over redis.cluster.RedisCluster", counts)
    assert counts == {"exists": 0, "add": 0, "rest": 0}


def test_valkey_py_cluster_one_hop(cluster_port, cluster_ports):
    with valkey.ValkeyCluster(host="127.0.0.1", port=cluster_port) as client:
        counts = one_hop(libmember.Sets(client), "route_valkey_py", cluster_ports)
    report("libmember.Sets over valkey.cluster.ValkeyCluster", counts)
    assert counts == {"exists": 0, "add": 0, "rest": 0}


def test_the_count_sees_a_misrouted_call(cluster_port, cluster_ports):
    """GLIDE's custom_command without a route, as the issue measured it: the same count shows
    the MOVED that libmember's routes avoid."""
    client = glide_sync_cluster(cluster_port)
    sets = libmember.Sets(client)
    name = "route_unrouted"
    try:
        sets.create(name, normalize="none")
        text = [i for i in ITEMS if isinstance(i, str)][:300]
        with Counted(cluster_ports) as c:
            for item in text:
                assert client.custom_command(["MEMBER.EXISTS", name, item]) == 0
        print(f"MOVED per 300: glide_sync custom_command without a route: EXISTS {c.count}")
        # Two in three on 3 primaries when the node is picked at random (the issue: 659-672
        # per 1000); anything well above 0 shows the count works.
        assert c.count >= 100, c.count
        # Set-wide calls unrouted: shows whether GLIDE picks a random node or argv[1].
        with Counted(cluster_ports) as c:
            for _ in range(100):
                client.custom_command(["MEMBER.INFO", name])
        print(f"MOVED per 100: glide_sync custom_command without a route: INFO {c.count}")
        sets.drop(name, delete_data=True)
    finally:
        client.close()
