"""``libmember.Sets`` over ``redis.cluster.RedisCluster`` and its asyncio twin, started from
the node ``MEMBER_CLUSTER_PORT`` names (a replica: every method must work from any node)."""

import asyncio
import time

import pytest
import redis.asyncio.cluster
from redis.cluster import RedisCluster

import libmember
import libmember.asyncio


@pytest.fixture
def rc(cluster_port):
    client = RedisCluster(host="127.0.0.1", port=cluster_port, decode_responses=True)
    yield client
    client.close()


def primaries_of(rc, items):
    return {rc.get_node_from_key(i).name for i in items}


def info_once_every_primary_has_its_filter(sets, name, timeout=30.0):
    """MEMBER.INFO once each primary holds a filter of the set: the primaries that only
    learned of it from the catalog build theirs in the background, which takes seconds on a
    busy machine, and a node without one reports no filter figures."""
    deadline = time.monotonic() + timeout
    while True:
        info = sets.info(name)
        primaries = [n for n in info["nodes"] if n.get("role") == "primary"]
        if all(n.get("filter_present") is True for n in primaries):
            return info
        assert time.monotonic() < deadline, f"a primary has no filter of {name}: {primaries}"
        time.sleep(0.1)


def test_every_method_across_slots(rc):
    sets = libmember.Sets(rc)
    name = "pyc_users"
    items = [f"user-{i}" for i in range(30)]
    # The items span every primary, so each call below crosses slots.
    assert len(primaries_of(rc, items)) == len(rc.get_primaries()) == 3
    sets.create(name, normalize="lower", capacity=10_000, cache_ttl=300)
    assert [sets.add(name, i) for i in items] == [True] * 30
    assert [sets.exists(name, i) for i in items] == [True] * 30
    assert sets.add(name, "user-0") is False
    assert sets.exists(name, "nobody") is False
    # A spelling whose canonical form lives on another node: forwarded by the server.
    assert sets.exists(name, "  USER-7 ") is True

    assert sets.mexists(name, ["user-1", "absent-1", "user-29", "absent-2"]) == [
        True, False, True, False
    ]
    fresh = [f"new-{i}" for i in range(12)]
    assert len(primaries_of(rc, fresh)) > 1
    assert sets.madd(name, fresh + ["user-3"]) == [True] * 12 + [False]
    assert sets.mexists(name, fresh) == [True] * 12
    assert sets.madd(name, ["s1", "s2"], scope="tenant") == [True, True]
    assert sets.mexists(name, ["s1", "s2"], scope="tenant") == [True, True]
    assert sets.mexists(name, ["s1"]) == [False]

    e = sets.explain(name, "user-5")
    assert e.answer is True and e.path in ("db-hit", "cache-hit"), e
    assert sets.delete(name, "user-5") is True
    assert sets.exists(name, "user-5") is False

    sets.alter(name, cache_ttl=60)
    # INFO covers the whole cluster: totals, and each node's part.
    info = info_once_every_primary_has_its_filter(sets, name)
    assert info["name"] == name and info["cache_ttl"] == 60
    nodes = info["nodes"]
    assert isinstance(nodes, list) and len(nodes) == info["cluster_nodes"] == 6
    assert info["cluster_slots_owned"] == 16384 and info["cluster_nodes_answered"] == 6
    assert sorted(n["role"] for n in nodes) == ["primary"] * 3 + ["replica"] * 3
    assert all(n["state"] == "ok" and n["cluster_node"] == n["node_id"] for n in nodes)
    assert info["filter_items"] == sum(n["filter_items"] for n in nodes if n["role"] == "primary")

    # REBUILD reaches every primary; SYNC sums their rows: every member, counted once.
    members = 30 - 1 + 12 + 2
    assert sets.rebuild(name, sync=True) == members
    assert sets.rebuild(name) is None

    with pytest.raises(libmember.NoSuchSet):
        sets.exists("pyc_nosuch", "x")
    with pytest.raises(libmember.NoSuchSet):
        sets.info("pyc_nosuch")
    with pytest.raises(libmember.NoSuchSet):
        sets.mexists("pyc_nosuch", ["x", "y"])
    sets.drop(name, delete_data=True)


def test_asyncio_cluster(cluster_port):
    async def main():
        rc = redis.asyncio.cluster.RedisCluster(
            host="127.0.0.1", port=cluster_port, decode_responses=True
        )
        try:
            sets = libmember.asyncio.Sets(rc)
            name = "pyc_async"
            items = [f"a-{i}" for i in range(20)]
            await sets.create(name, normalize="none")
            assert [await sets.add(name, i) for i in items] == [True] * 20
            assert [await sets.exists(name, i) for i in items] == [True] * 20
            assert await sets.exists(name, "absent") is False
            assert await sets.madd(name, ["b-1", "b-2", "a-1"]) == [True, True, False]
            assert await sets.mexists(name, ["b-1", "zz", "a-19"]) == [True, False, True]
            info = await sets.info(name)
            assert info["name"] == name and info["cluster_nodes"] == 6
            assert await sets.rebuild(name, sync=True) == 22
            with pytest.raises(libmember.NoSuchSet):
                await sets.exists("pyc_nosuch", "x")
            await sets.drop(name, delete_data=True)
        finally:
            await rc.aclose()

    asyncio.run(main())
