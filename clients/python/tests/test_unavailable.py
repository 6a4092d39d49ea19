"""``Unavailable`` while PostgreSQL is stopped. tests/all/python_client.rs runs the first test,
stops the database, then runs the second."""

import asyncio

import glide
import glide_sync
import pytest
import redis
import redis.asyncio

import libmember
import libmember.asyncio

# GLIDE gives up on a call after 250 ms unless told otherwise, less than the module's
# member.db-timeout-ms (2 s) and a CREATE's build: docs/clients.md.
TIMEOUT_MS = 30_000


def test_prepare_while_up(sets):
    sets.create("down")
    # Added but never looked up: the filter lets them through and no cache entry holds them,
    # so a lookup needs the database.
    assert sets.madd("down", ["alice", "bob"]) == [True, True]


def test_unavailable_while_down(sets, url, address):
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

    # Over GLIDE too: the same class, also GLIDE's own RequestError.
    host, port = address
    client = glide_sync.GlideClient.create(
        glide_sync.GlideClientConfiguration(
            [glide_sync.NodeAddress(host, port)], request_timeout=TIMEOUT_MS
        )
    )
    try:
        with pytest.raises(libmember.Unavailable) as e:
            libmember.Sets(client).exists("down", "alice")
        assert isinstance(e.value, glide_sync.RequestError) and e.value.retryable
        assert str(e.value).startswith("UNAVAILABLE"), str(e.value)
    finally:
        client.close()

    async def over_glide():
        client = await glide.GlideClient.create(
            glide.GlideClientConfiguration(
            [glide.NodeAddress(host, port)], request_timeout=TIMEOUT_MS
        )
        )
        try:
            with pytest.raises(libmember.Unavailable):
                await libmember.asyncio.Sets(client).madd("down", ["erin"])
        finally:
            await client.close()

    asyncio.run(over_glide())
