"""``libmember.asyncio.Sets`` over ``redis.asyncio.Redis``, against a standalone server."""

import asyncio

import pytest
import redis.asyncio

import libmember
import libmember.asyncio


def run(url, body):
    async def main():
        client = redis.asyncio.Redis.from_url(url, decode_responses=True)
        try:
            await body(libmember.asyncio.Sets(client))
        finally:
            await client.aclose()

    asyncio.run(main())


def test_every_method(url):
    async def body(sets):
        await sets.create("async_users", normalize="lower", capacity=1000, cache_ttl=30)
        assert await sets.add("async_users", "Alice") is True
        assert await sets.add("async_users", "alice") is False
        assert await sets.exists("async_users", " ALICE") is True
        assert await sets.exists("async_users", "bob") is False
        assert await sets.madd("async_users", ["bob", "carol", "alice"]) == [True, True, False]
        assert await sets.mexists("async_users", ["bob", "dave", "carol"]) == [True, False, True]
        assert await sets.add("async_users", "x", scope="s", ttl=3600) is True
        assert await sets.exists("async_users", "x", scope="s") is True
        e = await sets.explain("async_users", "nobody")
        assert e == libmember.Explanation(False, "bloom-negative")
        assert await sets.delete("async_users", "bob") is True
        await sets.alter("async_users", cache_ttl=60, sync=True)
        info = await sets.info("async_users")
        assert info["cache_ttl"] == 60 and info["filter_complete"] is True
        assert info["normalize"] == "lower" and type(info["filter_fill"]) is float
        assert await sets.rebuild("async_users", sync=True) == 3
        await sets.drop("async_users")
        with pytest.raises(libmember.NoSuchSet):
            await sets.exists("async_users", "alice")

    run(url, body)


def test_refuses_a_blocking_client(url):
    import redis as blocking

    with pytest.raises(TypeError, match="libmember.Sets"):
        libmember.asyncio.Sets(blocking.Redis.from_url(url))
    assert libmember.asyncio.AsyncSets is libmember.asyncio.Sets
