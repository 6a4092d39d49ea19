"""``libmember.asyncio.Sets``: the MEMBER.* commands over an asyncio client: redis-py's,
valkey-py's or valkey-glide's (``glide``).

The twin of ``libmember.Sets`` (same methods, same replies, same errors), awaited.
"""

from typing import Any, Dict, List, Optional, Sequence, Union

from . import _command as cmd
from ._clients import ASYNC_CLIENTS, async_sender, sync_sender
from ._command import Explanation, InfoValue, Item

__all__ = ["Sets", "AsyncSets"]


class Sets:
    """The sets of a libmember server, through ``client``: a ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster``, valkey-py's ``valkey.asyncio.Valkey`` or
    ``valkey.asyncio.cluster.ValkeyCluster``, or valkey-glide's ``glide.GlideClient`` or
    ``glide.GlideClusterClient``. Each method is ``libmember.Sets``'s, awaited, routed the
    same way."""

    def __init__(self, client: Any) -> None:
        sender = async_sender(client)
        if sender is None:
            hint = (
                " (blocking clients: libmember.Sets)" if sync_sender(client) is not None else ""
            )
            raise TypeError(f"libmember.asyncio.Sets needs one of {ASYNC_CLIENTS}{hint}")
        self.client = client
        self._sender = sender

    async def _run(self, command: Union[cmd.Args, cmd.Many]) -> Any:
        """``libmember.Sets._run``, awaited."""
        args = command.args() if isinstance(command, cmd.Many) else command
        try:
            return await self._sender.send(args, cmd.routing_key(args))
        except self._sender.family.reply_error as e:
            typed = self._sender.family.typed(e)
            if typed is e:
                raise
            raise typed from e

    async def create(self, name: str, **settings: Any) -> None:
        cmd.is_ok(await self._run(cmd.create(name, settings)))

    async def alter(self, name: str, sync: bool = False, **settings: Any) -> None:
        cmd.is_ok(await self._run(cmd.alter(name, sync, settings)))

    async def drop(self, name: str, delete_data: bool = False) -> None:
        cmd.is_ok(await self._run(cmd.drop(name, delete_data)))

    async def add(
        self,
        name: str,
        item: Item,
        scope: Optional[Item] = None,
        ttl: Optional[int] = None,
        expireat: Optional[int] = None,
    ) -> bool:
        return bool(await self._run(cmd.add(name, item, scope, ttl, expireat)))

    async def exists(self, name: str, item: Item, scope: Optional[Item] = None) -> bool:
        return bool(await self._run(cmd.item("MEMBER.EXISTS", name, item, scope)))

    async def delete(self, name: str, item: Item, scope: Optional[Item] = None) -> bool:
        return bool(await self._run(cmd.item("MEMBER.DEL", name, item, scope)))

    async def explain(self, name: str, item: Item, scope: Optional[Item] = None) -> Explanation:
        return cmd.explanation(await self._run(cmd.item("MEMBER.EXPLAIN", name, item, scope)))

    async def mexists(
        self, name: str, items: Sequence[Item], scope: Optional[Item] = None
    ) -> List[bool]:
        if not items:
            return []
        return cmd.flags(await self._run(cmd.mexists(name, items, scope)))

    async def madd(
        self,
        name: str,
        items: Sequence[Item],
        scope: Optional[Item] = None,
        ttl: Optional[int] = None,
        expireat: Optional[int] = None,
    ) -> List[bool]:
        if not items:
            return []
        return cmd.flags(await self._run(cmd.madd(name, items, scope, ttl, expireat)))

    async def info(self, name: str) -> Dict[str, InfoValue]:
        return cmd.info_dict(await self._run(cmd.info(name)))

    async def rebuild(self, name: str, sync: bool = False) -> Optional[int]:
        reply = await self._run(cmd.rebuild(name, sync))
        if sync:
            return int(reply)
        cmd.is_ok(reply)
        return None


AsyncSets = Sets
