"""``libmember.Sets`` over valkey-glide's sync ``GlideClient`` and ``libmember.asyncio.Sets`` over
its async one, and both over valkey-py, against a standalone server: the same typed results and
typed errors as over redis-py, each error also the library's own class."""

import asyncio

import glide
import glide_sync
import pytest
import redis
import valkey
import valkey.asyncio
from glide_shared.exceptions import RequestError

import libmember
import libmember.asyncio

# GLIDE gives up on a call after 250 ms unless told otherwise, less than the module's
# member.db-timeout-ms (2 s) and a CREATE's build: docs/clients.md.
TIMEOUT_MS = 30_000


def glide_sync_client(address, user=None):
    host, port = address
    credentials = glide_sync.ServerCredentials("x", user) if user else None
    return glide_sync.GlideClient.create(
        glide_sync.GlideClientConfiguration(
            [glide_sync.NodeAddress(host, port)],
            credentials=credentials,
            request_timeout=TIMEOUT_MS,
        )
    )


async def glide_async_client(address):
    host, port = address
    return await glide.GlideClient.create(
        glide.GlideClientConfiguration(
            [glide.NodeAddress(host, port)], request_timeout=TIMEOUT_MS
        )
    )


def every_method(sets, name):
    """The calls of test_sets.py, in one pass; returns nothing, asserts everything."""
    sets.create(name, normalize="lower", capacity=1000, cache_ttl=30)
    sets.create(name, normalize="lower")
    assert sets.add(name, "Alice") is True
    assert sets.add(name, "alice") is False
    assert sets.exists(name, " ALICE") is True
    assert sets.exists(name, "bob") is False
    assert sets.madd(name, ["bob", "carol", "alice"]) == [True, True, False]
    assert sets.mexists(name, ["bob", "dave", "carol"]) == [True, False, True]
    assert sets.mexists(name, []) == [] and sets.madd(name, []) == []
    assert sets.add(name, "x", scope="s", ttl=3600) is True
    assert sets.exists(name, "x", scope="s") is True and sets.exists(name, "x") is False
    assert sets.madd(name, [b"\xc3\xa9t\xc3\xa9", b"Zed"]) == [True, True]
    assert sets.exists(name, "été") is True and sets.exists(name, b"ZED") is True
    assert sets.explain(name, "nobody") == libmember.Explanation(False, "bloom-negative")
    first = sets.explain(name, "carol")
    assert first.answer is True and first.path in ("db-hit", "cache-hit"), first
    assert sets.delete(name, "bob") is True and sets.delete(name, "bob") is False
    sets.alter(name, cache_ttl=60, sync=True)
    info = sets.info(name)
    assert info["name"] == name and info["cache_ttl"] == 60 and info["capacity"] == 1000
    assert info["filter_complete"] is True and type(info["filter_fill"]) is float
    assert type(info["filter_items"]) is int and info["normalize"] == "lower"
    assert sets.rebuild(name, sync=True) == 5
    assert sets.rebuild(name) is None
    sets.drop(name, delete_data=True)


def test_glide_sync_every_method(address):
    client = glide_sync_client(address)
    try:
        every_method(libmember.Sets(client), "glide_sync_users")
    finally:
        client.close()


def test_valkey_py_every_method(url):
    every_method(libmember.Sets(valkey.Valkey.from_url(url)), "valkey_users")


def typed_errors(sets, own_error):
    """NoSuchSet for a missing set, the library's plain error for any other refusal."""
    for call in (
        lambda: sets.exists("nosuch", "x"),
        lambda: sets.add("nosuch", "x"),
        lambda: sets.mexists("nosuch", ["x"]),
        lambda: sets.info("nosuch"),
        lambda: sets.drop("nosuch"),
    ):
        with pytest.raises(libmember.NoSuchSet) as e:
            call()
        assert isinstance(e.value, own_error) and isinstance(e.value, redis.ResponseError)
        assert "no such set: create it with MEMBER.CREATE" in str(e.value)
    with pytest.raises(own_error, match="invalid set name") as e:
        sets.exists("Not-A-Name", "x")
    assert not isinstance(e.value, (libmember.NoSuchSet, libmember.NoPermission))


def test_glide_sync_errors(address, r):
    client = glide_sync_client(address)
    sets = libmember.Sets(client)
    typed_errors(sets, RequestError)
    sets.create("gcards")
    sets.add("gcards", "4111")
    # May read member:gcards, not write it; GLIDE asks INFO and CLIENT when it connects.
    r.execute_command("ACL", "SETUSER", "greader", "on", ">x", "+@all", "%R~member:gcards")
    r.execute_command("ACL", "SETUSER", "gpinger", "on", ">x", "+ping", "+info", "+client")
    reader = libmember.Sets(glide_sync_client(address, "greader"))
    assert reader.exists("gcards", "4111") is True
    with pytest.raises(libmember.NoPermission, match="may not write set 'gcards'") as e:
        reader.add("gcards", "5500")
    assert isinstance(e.value, RequestError)
    pinger = libmember.Sets(glide_sync_client(address, "gpinger"))
    with pytest.raises(libmember.NoPermission, match="no permissions to run"):
        pinger.exists("gcards", "4111")
    assert sets.exists("gcards", "5500") is False
    for c in (client, reader.client, pinger.client):
        c.close()


def test_valkey_py_errors(url):
    typed_errors(libmember.Sets(valkey.Valkey.from_url(url)), valkey.exceptions.ResponseError)


def test_glide_async_every_method_and_errors(address):
    async def main():
        client = await glide_async_client(address)
        try:
            sets = libmember.asyncio.Sets(client)
            name = "glide_async_users"
            await sets.create(name, normalize="lower", cache_ttl=30)
            assert await sets.add(name, "Alice") is True
            assert await sets.add(name, "alice") is False
            # Concurrent calls on one client: GLIDE multiplexes them on its connection.
            items = [f"c-{i}" for i in range(200)]
            assert await sets.madd(name, items[:100]) == [True] * 100
            found = await asyncio.gather(*(sets.exists(name, i) for i in items))
            assert found == [True] * 100 + [False] * 100
            assert await sets.mexists(name, ["alice", "nobody", "c-7"]) == [True, False, True]
            e = await sets.explain(name, "nobody")
            assert e == libmember.Explanation(False, "bloom-negative")
            assert await sets.delete(name, "alice") is True
            await sets.alter(name, cache_ttl=60, sync=True)
            info = await sets.info(name)
            assert info["cache_ttl"] == 60 and info["filter_complete"] is True
            assert await sets.rebuild(name, sync=True) == 100
            await sets.drop(name, delete_data=True)
            with pytest.raises(libmember.NoSuchSet) as raised:
                await sets.exists(name, "alice")
            assert isinstance(raised.value, RequestError)
            with pytest.raises(RequestError, match="invalid set name"):
                await sets.exists("Not-A-Name", "x")
            # The blocking Sets refuses the async client, and says which one to use.
            with pytest.raises(TypeError, match="libmember.asyncio.Sets"):
                libmember.Sets(client)
        finally:
            await client.close()

    asyncio.run(main())


def test_valkey_py_asyncio(url):
    async def main():
        client = valkey.asyncio.Valkey.from_url(url)
        try:
            sets = libmember.asyncio.Sets(client)
            await sets.create("valkey_async")
            assert await sets.madd("valkey_async", ["a", "b"]) == [True, True]
            assert await sets.exists("valkey_async", "a") is True
            with pytest.raises(libmember.NoSuchSet):
                await sets.exists("nosuch", "a")
            await sets.drop("valkey_async", delete_data=True)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_refuses_what_it_cannot_route(address):
    client = glide_sync_client(address)
    with pytest.raises(TypeError, match="libmember.asyncio.Sets"):
        libmember.asyncio.Sets(object())
    with pytest.raises(TypeError, match=r"\(blocking clients: libmember.Sets\)"):
        libmember.asyncio.Sets(client)
    client.close()
