"""Which client library a ``Sets`` was given, and how it sends one MEMBER.* command to the node
that serves it, its error replies raised as libmember's typed errors.

redis-py and valkey-py route a module command by the key position it declares (``COMMAND``):
nothing to add. valkey-glide does not read those for a command it does not know: it would send
every call by argv[1], the set name, and two per-item calls in three to a node that answers
MOVED, so it is told the route: the primary of the routing argument's slot (``ROUTING_ARG``:
the item for ADD, EXISTS, DEL and EXPLAIN, the set name for the rest). A library the
application never imported cannot have made the client, so only the ones in ``sys.modules``
are looked at.
"""

import sys
from functools import lru_cache
from typing import Any, Callable, NamedTuple, Optional

from . import _command as cmd
from ._command import Args, Item
from .errors import REDIS, Family, glide_reply_text, reply_text

SYNC_CLIENTS = (
    "redis.Redis, redis.cluster.RedisCluster, valkey.Valkey, valkey.cluster.ValkeyCluster, "
    "glide_sync.GlideClient or glide_sync.GlideClusterClient"
)
ASYNC_CLIENTS = (
    "redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster, valkey.asyncio.Valkey, "
    "valkey.asyncio.cluster.ValkeyCluster, glide.GlideClient or glide.GlideClusterClient"
)


class Sender(NamedTuple):
    """``send(args, routing_argument)`` sends one command (for an asyncio client it returns
    the awaitable); ``family`` turns its error replies into typed errors."""

    send: Callable[[Args, Item], Any]
    family: Family


@lru_cache(maxsize=None)
def valkey_family() -> Family:
    from valkey.exceptions import NoPermissionError, ResponseError

    return Family(ResponseError, lambda e: reply_text(e, NoPermissionError), NoPermissionError)


@lru_cache(maxsize=None)
def glide_family() -> Family:
    from glide_shared.exceptions import RequestError

    return Family(RequestError, glide_reply_text)


def glide_route(key: Item) -> Any:
    """The primary serving ``key``'s slot, as GLIDE names it. GLIDE takes a slot key as text,
    so bytes that are not UTF-8 go by the slot computed here, as the server computes it."""
    from glide_shared.routes import SlotIdRoute, SlotKeyRoute, SlotType

    if isinstance(key, (bytes, bytearray, memoryview)):
        try:
            key = bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            return SlotIdRoute(SlotType.PRIMARY, cmd.keyslot(bytes(key)))
    return SlotKeyRoute(SlotType.PRIMARY, key)


def _loaded(module: str) -> Any:
    return sys.modules.get(module)


def _by_declared_keys(client: Any) -> Callable[[Args, Item], Any]:
    """redis-py and valkey-py: the library routes by the key position COMMAND declares."""
    return lambda args, _key: client.execute_command(*args)


def glide_args(args: Args) -> Args:
    """GLIDE takes only text and bytes: numbers (CAPACITY, TTL, …) as the server reads them."""
    return [a if isinstance(a, (str, bytes, bytearray, memoryview)) else str(a) for a in args]


def _glide(client: Any, cluster_class: type) -> Callable[[Args, Item], Any]:
    if isinstance(client, cluster_class):
        return lambda args, key: client.custom_command(glide_args(args), route=glide_route(key))
    return lambda args, _key: client.custom_command(glide_args(args))


def sync_sender(client: Any) -> Optional[Sender]:
    """How ``client`` sends, if it is one of the blocking clients (``SYNC_CLIENTS``)."""
    import redis
    import redis.cluster

    if isinstance(client, (redis.Redis, redis.cluster.RedisCluster)):
        return Sender(_by_declared_keys(client), REDIS)
    valkey = _loaded("valkey")
    if valkey is not None and isinstance(client, (valkey.Valkey, valkey.ValkeyCluster)):
        return Sender(_by_declared_keys(client), valkey_family())
    glide_sync = _loaded("glide_sync")
    if glide_sync is not None and isinstance(
        client, (glide_sync.GlideClient, glide_sync.GlideClusterClient)
    ):
        return Sender(_glide(client, glide_sync.GlideClusterClient), glide_family())
    return None


def async_sender(client: Any) -> Optional[Sender]:
    """How ``client`` sends, if it is one of the asyncio clients (``ASYNC_CLIENTS``)."""
    import redis.asyncio
    import redis.asyncio.cluster

    if isinstance(client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)):
        return Sender(_by_declared_keys(client), REDIS)
    valkey = _loaded("valkey.asyncio")
    if valkey is not None and isinstance(client, (valkey.Valkey, valkey.ValkeyCluster)):
        return Sender(_by_declared_keys(client), valkey_family())
    glide = _loaded("glide")
    if glide is not None and isinstance(client, (glide.GlideClient, glide.GlideClusterClient)):
        return Sender(_glide(client, glide.GlideClusterClient), glide_family())
    return None
