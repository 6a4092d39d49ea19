"""The typed errors: which replies become which class, against a standalone server, and the
mapping itself on replies as each redis-py release presents them."""

import pytest
import redis
from redis.exceptions import NoPermissionError, ResponseError

import libmember
from libmember.errors import map_error


def test_every_typed_error_is_a_response_error():
    for cls in (libmember.Unavailable, libmember.NoSuchSet, libmember.NoPermission):
        assert issubclass(cls, ResponseError)
    assert issubclass(libmember.NoPermission, NoPermissionError)
    assert libmember.Unavailable.retryable is True


def test_no_such_set(sets):
    for call in (
        lambda: sets.exists("nosuch", "x"),
        lambda: sets.add("nosuch", "x"),
        lambda: sets.mexists("nosuch", ["x"]),
        lambda: sets.info("nosuch"),
        lambda: sets.rebuild("nosuch"),
        lambda: sets.alter("nosuch", cache_ttl=5),
        lambda: sets.drop("nosuch"),
    ):
        with pytest.raises(libmember.NoSuchSet) as e:
            call()
        # redis-py's message, kept as it was.
        assert "no such set: create it with MEMBER.CREATE" in str(e.value)


def test_other_errors_stay_untyped(sets):
    with pytest.raises(ResponseError, match="ERROR must be a number") as e:
        sets.create("bad", error=2)
    assert type(e.value) is ResponseError
    with pytest.raises(ResponseError, match="invalid set name") as e:
        sets.exists("Not-A-Name", "x")
    assert type(e.value) is ResponseError


def test_module_permission_refusal(r, url):
    sets = libmember.Sets(r)
    sets.create("cards")
    sets.add("cards", "4111")
    # May read member:cards, not write it.
    r.execute_command("ACL", "SETUSER", "reader", "on", "nopass", "+@all", "%R~member:cards")
    reader = libmember.Sets(redis.Redis.from_url(url, username="reader", password="x",
                                                 decode_responses=True))
    assert reader.exists("cards", "4111") is True
    for call in (lambda: reader.add("cards", "5500"), lambda: reader.madd("cards", ["5500"])):
        with pytest.raises(libmember.NoPermission) as e:
            call()
        assert "this user may not write set 'cards'" in str(e.value)
        assert isinstance(e.value, NoPermissionError)
    assert sets.exists("cards", "5500") is False


def test_server_permission_refusal(r, url):
    libmember.Sets(r).create("cards")
    r.execute_command("ACL", "SETUSER", "pinger", "on", "nopass", "+ping", "~*")
    pinger = libmember.Sets(redis.Redis.from_url(url, username="pinger", password="x",
                                                 decode_responses=True))
    with pytest.raises(libmember.NoPermission, match="no permissions to run"):
        pinger.exists("cards", "4111")


# Replies as redis-py 5 presents them (code stripped from ERR and NOPERM, status_code absent).
@pytest.mark.parametrize(
    "exc, typed",
    [
        (ResponseError("UNAVAILABLE source of truth did not answer"), libmember.Unavailable),
        (ResponseError("no such set: create it with MEMBER.CREATE"), libmember.NoSuchSet),
        (NoPermissionError("this user may not read set 's' (needs …)"), libmember.NoPermission),
        (ResponseError("SOURCE table is not allowed by member.attach-allow: …"),
         libmember.NoPermission),
        (ResponseError("item is empty"), None),
        (ResponseError("TRYAGAIN libmember: no node serves the item's canonical slot"), None),
        (ResponseError("a rebuild of this set is already running (see MEMBER.INFO)"), None),
    ],
)
def test_mapping(exc, typed):
    mapped = map_error(exc)
    if typed is None:
        assert mapped is exc
    else:
        assert type(mapped) is typed and mapped.args == exc.args


def coded(cls, message, code):
    """A reply as newer redis-py releases present it: the code in ``status_code``."""
    e = cls(message)
    e.status_code = code
    return e


@pytest.mark.parametrize(
    "exc, typed",
    [
        (coded(ResponseError, "no such set: create it with MEMBER.CREATE", "ERR"),
         libmember.NoSuchSet),
        (coded(NoPermissionError, "this user may not write set 's' (…)", "NOPERM"),
         libmember.NoPermission),
        (coded(ResponseError, "item is empty", "ERR"), None),
    ],
)
def test_mapping_with_status_code(exc, typed):
    mapped = map_error(exc)
    if typed is None:
        assert mapped is exc
    else:
        assert type(mapped) is typed and str(mapped) == str(exc)
        assert mapped.status_code == exc.status_code


# Replies as valkey-glide presents them: the code named by its Rust client's error kind.
@pytest.mark.parametrize(
    "message, typed",
    [
        ("UNAVAILABLE: source of truth unavailable: timed out", libmember.Unavailable),
        ("An error was signalled by the server: - ResponseError: no such set: create it with "
         "MEMBER.CREATE", libmember.NoSuchSet),
        ("An error was signalled by the server: - PermissionDenied: this user may not read set "
         "'s' (needs …)", libmember.NoPermission),
        ("An error was signalled by the server: - ResponseError: SOURCE table is not allowed by "
         "member.attach-allow: …", libmember.NoPermission),
        ("An error was signalled by the server: - ResponseError: item is empty", None),
        ("An error was signalled by the server: - TryAgain: libmember: no node serves the "
         "item's canonical slot", None),
        ("no such set", None),  # a client-side message, not a reply
    ],
)
def test_mapping_of_glide_errors(message, typed):
    from glide_shared.exceptions import RequestError

    from libmember._clients import glide_family

    e = RequestError(message)
    mapped = glide_family().typed(e)
    if typed is None:
        assert mapped is e
    else:
        assert isinstance(mapped, typed) and isinstance(mapped, RequestError)
        assert str(mapped) == message
