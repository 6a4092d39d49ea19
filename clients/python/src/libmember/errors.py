"""The typed errors of libmember's replies, and the one table that maps a reply to them.

Every class is a subclass of redis-py's ``ResponseError``, so code that catches that keeps
working; each keeps the message its client library gave (``str(e)`` is unchanged). Over
valkey-py and valkey-glide the error raised is a subclass of both the typed class and that
library's own error class (``valkey.exceptions.ResponseError``, glide's ``RequestError``), so
code written against either keeps catching it. The reply texts are the server's
(``src/model/error.rs``; all listed in ``docs/commands.md``).
"""

from typing import Callable, Dict, Optional, Tuple, Type

from redis.exceptions import NoPermissionError, ResponseError

__all__ = ["Unavailable", "NoSuchSet", "NoPermission", "map_error", "Family"]


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


def reply_text(e: Exception, permission_error: Type[Exception] = NoPermissionError) -> str:
    """The error reply as the server sent it. redis-py (and valkey-py, whose
    ``NoPermissionError`` is ``permission_error``) strips the ``ERR`` and ``NOPERM`` codes
    from the message (newer releases keep the code in ``status_code``) and leaves codes it
    does not know, such as ``UNAVAILABLE``, in place."""
    message = str(e)
    code: Optional[str] = getattr(e, "status_code", None)
    if code:
        return f"{code} {message}"
    if isinstance(e, permission_error):
        return f"NOPERM {message}"
    if message.startswith("UNAVAILABLE"):
        return message
    return f"ERR {message}"


def map_error(e: ResponseError) -> ResponseError:
    """The typed error for reply ``e`` (the same message and attributes), or ``e`` itself
    when its reply is none of the typed ones."""
    return REDIS.typed(e)


# GLIDE names the reply's code by its Rust client's error kind: `-ERR no such set…` reaches
# Python as "An error was signalled by the server: - ResponseError: no such set…", `-NOPERM …`
# as "… - PermissionDenied: …", and a code it has no kind for as "UNAVAILABLE: …".
GLIDE_SERVER_PREFIX = "An error was signalled by the server: - "
GLIDE_KINDS = {"ResponseError": "ERR", "PermissionDenied": "NOPERM"}


def glide_reply_text(e: Exception) -> str:
    """The error reply as the server sent it, from a valkey-glide ``RequestError``."""
    message = str(e)
    if message.startswith(GLIDE_SERVER_PREFIX):
        kind, _, rest = message[len(GLIDE_SERVER_PREFIX) :].partition(": ")
        return f"{GLIDE_KINDS.get(kind, kind)} {rest}"
    code, colon, rest = message.partition(": ")
    if colon and code.isupper() and " " not in code:
        return f"{code} {rest}"
    return message


class Family:
    """One client library's errors: its error reply class, how to read the server's reply
    text from it, and the typed classes raised for it (``Unavailable`` and the others,
    subclassed with the library's own class when that is not redis-py's)."""

    def __init__(
        self,
        reply_error: Type[Exception],
        text: Callable[[Exception], str],
        permission_error: Optional[Type[Exception]] = None,
    ) -> None:
        self.reply_error = reply_error
        self.text = text
        self.classes: Dict[Type[ResponseError], Type[ResponseError]] = {}
        for base in (Unavailable, NoSuchSet, NoPermission):
            if issubclass(base, reply_error):
                self.classes[base] = base
                continue
            own = permission_error if base is NoPermission and permission_error else reply_error
            self.classes[base] = type(base.__name__, (base, own), {"__module__": __name__})

    def typed(self, e: Exception) -> Exception:
        """The typed error for reply ``e`` (the same message and attributes), or ``e`` itself
        when its reply is none of the typed ones."""
        if isinstance(e, (Unavailable, NoSuchSet, NoPermission)):
            return e
        text = self.text(e)
        for prefix, base in REPLY_PREFIXES:
            if text.startswith(prefix):
                typed = self.classes[base](*e.args)
                typed.__dict__.update(e.__dict__)
                return typed
        return e


REDIS = Family(ResponseError, reply_text)  # type: ignore[arg-type]
