"""``Sets``: the MEMBER.* commands over a blocking client, standalone or cluster: redis-py,
valkey-py or valkey-glide's sync client.

Every answer is the server's: the client keeps no filter and no cache, and adds no retry.
"""

from typing import Any, Dict, List, Optional, Sequence, Union

from . import _command as cmd
from ._clients import SYNC_CLIENTS, async_sender, sync_sender
from ._command import Explanation, InfoValue, Item


class Sets:
    """The sets of a libmember server, through ``client``: a ``redis.Redis`` or
    ``redis.cluster.RedisCluster`` (with or without ``decode_responses``), valkey-py's
    ``valkey.Valkey`` or ``valkey.cluster.ValkeyCluster``, or valkey-glide's
    ``glide_sync.GlideClient`` or ``glide_sync.GlideClusterClient``.

    Error replies raise ``Unavailable``, ``NoSuchSet`` or ``NoPermission`` when they are one
    of those, the client library's own error otherwise. In cluster mode every call goes
    straight to the primary that serves it: ADD, EXISTS, DEL and EXPLAIN to the item's slot,
    every other method to the set name's (redis-py and valkey-py route by the key position
    each command declares; GLIDE is given that route with each call).
    """

    def __init__(self, client: Any) -> None:
        sender = sync_sender(client)
        if sender is None:
            hint = (
                " (for asyncio clients: libmember.asyncio.Sets)"
                if async_sender(client) is not None
                else ""
            )
            raise TypeError(f"libmember.Sets needs one of {SYNC_CLIENTS}{hint}")
        self.client = client
        self._sender = sender

    def _run(self, command: Union[cmd.Args, cmd.Many]) -> Any:
        """Sends one command to the node serving its routing argument (the item, or the set
        name: ``_command.ROUTING_ARG``); its error reply raised as a typed error."""
        args = command.args() if isinstance(command, cmd.Many) else command
        try:
            return self._sender.send(args, cmd.routing_key(args))
        except self._sender.family.reply_error as e:
            typed = self._sender.family.typed(e)
            if typed is e:
                raise
            raise typed from e

    def create(self, name: str, **settings: Any) -> None:
        """MEMBER.CREATE: returns once the set exists and its filter is built. ``settings``
        are CREATE's options, ``_`` for ``-``: ``error``, ``capacity``, ``cache_ttl``,
        ``recent_ttl``, ``normalize``, ``tokenize``; for an attached table ``source``,
        ``column``, ``scope_column``, ``sync`` or ``updated_column``. Creating an existing
        set with the same settings is fine."""
        cmd.is_ok(self._run(cmd.create(name, settings)))

    def alter(self, name: str, sync: bool = False, **settings: Any) -> None:
        """MEMBER.ALTER: ``error``, ``capacity``, ``cache_ttl``, ``recent_ttl``. With
        ``sync=True`` returns once the filter built with the new settings serves."""
        cmd.is_ok(self._run(cmd.alter(name, sync, settings)))

    def drop(self, name: str, delete_data: bool = False) -> None:
        """MEMBER.DROP; ``delete_data=True`` drops the set's table too."""
        cmd.is_ok(self._run(cmd.drop(name, delete_data)))

    def add(
        self,
        name: str,
        item: Item,
        scope: Optional[Item] = None,
        ttl: Optional[int] = None,
        expireat: Optional[int] = None,
    ) -> bool:
        """MEMBER.ADD: True when this call made ``item`` a member, False when it already was
        one. ``ttl`` (seconds) or ``expireat`` (unix seconds) make the membership expire."""
        return bool(self._run(cmd.add(name, item, scope, ttl, expireat)))

    def exists(self, name: str, item: Item, scope: Optional[Item] = None) -> bool:
        """MEMBER.EXISTS: whether ``item`` is a member, as the database says."""
        return bool(self._run(cmd.item("MEMBER.EXISTS", name, item, scope)))

    def delete(self, name: str, item: Item, scope: Optional[Item] = None) -> bool:
        """MEMBER.DEL: True when ``item`` was a member and is removed."""
        return bool(self._run(cmd.item("MEMBER.DEL", name, item, scope)))

    def explain(self, name: str, item: Item, scope: Optional[Item] = None) -> Explanation:
        """MEMBER.EXPLAIN: the answer and the tier of the funnel that decided it."""
        return cmd.explanation(self._run(cmd.item("MEMBER.EXPLAIN", name, item, scope)))

    def mexists(
        self, name: str, items: Sequence[Item], scope: Optional[Item] = None
    ) -> List[bool]:
        """MEMBER.MEXISTS: one answer per item, in the order given (in cluster mode the
        receiving node asks the owners of the items' slots)."""
        if not items:
            return []
        return cmd.flags(self._run(cmd.mexists(name, items, scope)))

    def madd(
        self,
        name: str,
        items: Sequence[Item],
        scope: Optional[Item] = None,
        ttl: Optional[int] = None,
        expireat: Optional[int] = None,
    ) -> List[bool]:
        """MEMBER.MADD: True for each item this call made a member. Standalone, one statement
        (all or none on ``Unavailable``); in cluster mode one statement per owner of the
        items' slots, so an error may leave some items added: repeat the call."""
        if not items:
            return []
        return cmd.flags(self._run(cmd.madd(name, items, scope, ttl, expireat)))

    def info(self, name: str) -> Dict[str, InfoValue]:
        """MEMBER.INFO as a dict: flags as bools, counts as ints, rates as floats, words as
        strings (``_command.info_value``). In cluster mode: the definition, totals over the
        nodes, and ``nodes``, a list of each node's fields (``node_id``, ``address``,
        ``role``, ``state``, then its own MEMBER.INFO fields)."""
        return cmd.info_dict(self._run(cmd.info(name)))

    def rebuild(self, name: str, sync: bool = False) -> Optional[int]:
        """MEMBER.REBUILD: None once started; with ``sync=True`` the number of members
        loaded. In cluster mode every primary rebuilds its slots (``sync``: the sum)."""
        reply = self._run(cmd.rebuild(name, sync))
        if sync:
            return int(reply)
        cmd.is_ok(reply)
        return None
