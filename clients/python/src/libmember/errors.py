"""The typed errors of libmember's replies, and the one table that maps a reply to them.

Every class is a subclass of redis-py's ``ResponseError``, so code that catches that keeps
working; each keeps the message redis-py gave (``str(e)`` is unchanged). The reply texts are
the server's (``src/error.rs``, ``src/acl.rs``; all listed in ``docs/commands.md``).
"""

from typing import Optional, Tuple, Type

from redis.exceptions import NoPermissionError, ResponseError

__all__ = ["Unavailable", "NoSuchSet", "NoPermission", "map_error"]


class Unavailable(ResponseError):
    """The source of truth could not answer: PostgreSQL is down, unreachable, slower than
    ``member.db-timeout-ms``, or too many clients already wait on it. Never a wrong answer:
    retry later. A write (ADD, MADD, DEL, CREATE, ...) answered this way may or may not have
    taken effect; repeating it is safe (ADD answers 0 once the item is a member)."""

    retryable = True


class NoSuchSet(ResponseError):
    """The set is not in the catalog: create it with ``Sets.create`` first."""


class NoPermission(NoPermissionError):
    """The connection's user may not run this command on this set: the module's per-set
    refusal (needs ACL key permission on ``member:<set>``), the server's own ``NOPERM`` (the
    command itself is not allowed), or a ``SOURCE`` table the operator's
    ``member.attach-allow`` does not list. Also a redis-py ``NoPermissionError``."""


# Reply prefix -> class, checked in order against the whole reply text (code and message).
# The one place a reply becomes a typed error.
REPLY_PREFIXES: Tuple[Tuple[str, Type[ResponseError]], ...] = (
    ("UNAVAILABLE", Unavailable),
    ("ERR no such set", NoSuchSet),
    ("NOPERM", NoPermission),
    ("ERR SOURCE table is not allowed by member.attach-allow", NoPermission),
)


def reply_text(e: ResponseError) -> str:
    """The error reply as the server sent it. redis-py strips the ``ERR`` and ``NOPERM``
    codes from the message (newer releases keep the code in ``status_code``) and leaves
    codes it does not know, such as ``UNAVAILABLE``, in place."""
    message = str(e)
    code: Optional[str] = getattr(e, "status_code", None)
    if code:
        return f"{code} {message}"
    if isinstance(e, NoPermissionError):
        return f"NOPERM {message}"
    if message.startswith("UNAVAILABLE"):
        return message
    return f"ERR {message}"


def map_error(e: ResponseError) -> ResponseError:
    """The typed error for reply ``e`` (the same message and attributes), or ``e`` itself
    when its reply is none of the typed ones."""
    if isinstance(e, (Unavailable, NoSuchSet, NoPermission)):
        return e
    text = reply_text(e)
    for prefix, cls in REPLY_PREFIXES:
        if text.startswith(prefix):
            typed = cls(*e.args)
            typed.__dict__.update(e.__dict__)
            return typed
    return e
