"""Every method of ``libmember.Sets`` over ``redis.Redis``, against a standalone server."""

import time

import pytest
import redis

import libmember


def test_create_add_exists_delete(sets):
    sets.create("users", normalize="username", capacity=10_000, error=0.001, cache_ttl=300)
    # Creating again with the same settings is fine.
    sets.create("users", normalize="username")
    assert sets.add("users", "Alice") is True
    assert sets.add("users", "alice") is False
    assert sets.exists("users", "  ALICE ") is True
    assert sets.exists("users", "bob") is False
    assert sets.delete("users", "alice") is True
    assert sets.delete("users", "alice") is False
    assert sets.exists("users", "Alice") is False


def test_create_passes_every_setting(sets):
    sets.create("tuned", normalize="lower", capacity=12_345, error=0.002, cache_ttl=77, recent_ttl=9)
    info = sets.info("tuned")
    assert info["normalize"] == "lower"
    assert info["capacity"] == 12_345
    assert info["error_rate"] == 0.002
    assert info["cache_ttl"] == 77
    assert info["recent_ttl"] == 9
    # Different settings for an existing set: the server's refusal, untyped.
    with pytest.raises(redis.ResponseError, match="different settings") as e:
        sets.create("tuned", capacity=99)
    assert type(e.value) is redis.ResponseError


def test_scope(sets):
    sets.create("cards")
    assert sets.add("cards", "4111", scope="merchant-9") is True
    assert sets.exists("cards", "4111") is False
    assert sets.exists("cards", "4111", scope="merchant-9") is True
    assert sets.exists("cards", "4111", scope="merchant-8") is False
    assert sets.explain("cards", "4111", scope="merchant-9").answer is True
    assert sets.delete("cards", "4111", scope="merchant-9") is True
    assert sets.exists("cards", "4111", scope="merchant-9") is False


def test_expiry_options_reach_the_server(sets):
    sets.create("temp")
    # The server validates the values: the client passes them as given.
    with pytest.raises(redis.ResponseError, match="TTL must be an integer"):
        sets.add("temp", "x", ttl=0)
    with pytest.raises(redis.ResponseError, match="EXPIREAT must be a unix time"):
        sets.add("temp", "x", expireat=1)
    with pytest.raises(redis.ResponseError, match="cannot be combined"):
        sets.madd("temp", ["x"], ttl=5, expireat=int(time.time()) + 60)
    assert sets.add("temp", "later", expireat=int(time.time()) + 3600) is True
    assert sets.madd("temp", ["m1", "m2"], ttl=3600) == [True, True]
    assert sets.add("temp", "brief", ttl=1) is True
    assert sets.exists("temp", "brief") is True
    # The membership ends with its TTL (the database stops reporting it).
    deadline = time.monotonic() + 30
    while sets.exists("temp", "brief") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sets.exists("temp", "brief") is False
    assert sets.mexists("temp", ["later", "m1", "m2", "x"]) == [True, True, True, False]


def test_explain(sets):
    sets.create("ex")
    e = sets.explain("ex", "nobody")
    assert isinstance(e, libmember.Explanation)
    assert e == (False, "bloom-negative")
    sets.add("ex", "somebody")
    first = sets.explain("ex", "somebody")
    assert first.answer is True and first.path in ("db-hit", "cache-hit"), first
    # The database's answer filled the cache.
    assert sets.explain("ex", "somebody") == (True, "cache-hit")


def test_mexists_madd(sets):
    sets.create("many")
    assert sets.madd("many", ["a", "b", "a"]) == [True, True, False]
    assert sets.madd("many", ["b", "c"]) == [False, True]
    assert sets.mexists("many", ["a", "x", "b", "c"]) == [True, False, True, True]
    assert sets.madd("many", ["a"], scope="s") == [True]
    assert sets.mexists("many", ["a", "b"], scope="s") == [True, False]
    # An item spelled like a keyword is an item.
    assert sets.madd("many", ["ITEMS", "SCOPE"], scope="ITEMS") == [True, True]
    assert sets.mexists("many", ["ITEMS", "SCOPE"], scope="ITEMS") == [True, True]
    assert sets.mexists("many", []) == []
    assert sets.madd("many", []) == []


def test_alter_and_rebuild(sets):
    sets.create("grow", capacity=1000)
    assert sets.madd("grow", [f"m{i}" for i in range(25)]) == [True] * 25
    sets.alter("grow", capacity=5000, cache_ttl=60, sync=True)
    info = sets.info("grow")
    assert info["capacity"] == 5000 and info["cache_ttl"] == 60
    assert info["filter_capacity"] >= 5000
    assert sets.rebuild("grow", sync=True) == 25
    assert sets.info("grow")["last_rebuild_reason"] == "manual"
    assert sets.rebuild("grow") is None
    deadline = time.monotonic() + 30
    while sets.info("grow")["rebuild_state"] != "idle" and time.monotonic() < deadline:
        time.sleep(0.1)
    info = sets.info("grow")
    assert info["rebuild_state"] == "idle" and info["last_rebuild_rows"] == 25


def test_info_types(sets):
    # A set name of digits stays a string.
    sets.create("123", normalize="none")
    sets.add("123", "x")
    sets.exists("123", "x")
    sets.exists("123", "y")
    info = sets.info("123")
    assert info["name"] == "123"
    for flag in ["filter_present", "filter_complete", "filter_caught_up", "filter_serves_absent"]:
        assert info[flag] is True, (flag, info[flag])
    assert info["auto_grow"] in (True, False)
    for count in ["capacity", "filter_bits", "filter_items", "exists_calls", "adds", "cache_ttl"]:
        assert type(info[count]) is int, (count, info[count])
    assert info["exists_calls"] == 2 and info["adds"] == 1 and info["filter_items"] == 1
    for rate in ["error_rate", "filter_fill", "filter_fpr_est", "db_fallback_rate"]:
        assert type(info[rate]) is float, (rate, info[rate])
    assert info["filter_fill"] > 0
    for word in ["normalize", "tokenize", "rebuild_state", "sync_horizon", "filter_origin"]:
        assert type(info[word]) is str, (word, info[word])
    assert info["normalize"] == "none" and info["filter_origin"] == "here"
    assert info["sync_age_ms"] == "never" or type(info["sync_age_ms"]) is int
    # The server's own reply, field for field: a map under RESP3, alternating names and
    # values under RESP2.
    raw = sets.client.execute_command("MEMBER.INFO", "123")
    assert list(info) == (list(raw) if isinstance(raw, dict) else raw[::2])


def test_drop(sets):
    sets.create("gone")
    sets.add("gone", "x")
    sets.drop("gone")
    with pytest.raises(libmember.NoSuchSet):
        sets.exists("gone", "x")
    sets.create("gone")
    assert sets.add("gone", "x") is False  # the table kept its rows
    sets.drop("gone", delete_data=True)
    sets.create("gone")
    assert sets.add("gone", "x") is True


def test_bytes_replies(url):
    sets = libmember.Sets(redis.Redis.from_url(url))  # without decode_responses
    sets.create("raw")
    assert sets.madd("raw", [b"\xc3\xa9t\xc3\xa9", "b"]) == [True, True]
    assert sets.exists("raw", "été") is True
    assert sets.explain("raw", "nope") == (False, "bloom-negative")
    info = sets.info("raw")
    assert info["name"] == "raw" and info["filter_complete"] is True
    assert sets.rebuild("raw", sync=True) == 2
    sets.alter("raw", cache_ttl=5)
    sets.drop("raw")


def test_refuses_an_asyncio_client(url):
    import redis.asyncio

    with pytest.raises(TypeError, match="libmember.asyncio.Sets"):
        libmember.Sets(redis.asyncio.Redis.from_url(url))
