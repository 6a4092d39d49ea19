"""``Unavailable`` while PostgreSQL is stopped. tests/all/python_client.rs runs the first test,
stops the database, then runs the second."""

import asyncio

import pytest
import redis
import redis.asyncio

import libmember
import libmember.asyncio


def test_prepare_while_up(sets):
    sets.create("down")
    # Added but never looked up: the filter lets them through and no cache entry holds them,
    # so a lookup needs the database.
    assert sets.madd("down", ["alice", "bob"]) == [True, True]


def test_unavailable_while_down(sets, url):
    for call in (
        lambda: sets.exists("down", "alice"),
        lambda: sets.mexists("down", ["bob"]),
        lambda: sets.add("down", "carol"),
        lambda: sets.madd("down", ["dave"]),
    ):
        with pytest.raises(libmember.Unavailable) as e:
            call()
        assert str(e.value).startswith("UNAVAILABLE"), str(e.value)
        assert isinstance(e.value, redis.ResponseError) and e.value.retryable

    async def asynchronous():
        client = redis.asyncio.Redis.from_url(url)
        try:
            with pytest.raises(libmember.Unavailable):
                await libmember.asyncio.Sets(client).exists("down", "alice")
        finally:
            await client.aclose()

    asyncio.run(asynchronous())
