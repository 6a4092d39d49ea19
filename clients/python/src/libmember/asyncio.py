"""``libmember.asyncio.Sets``: the MEMBER.* commands over redis-py's asyncio clients.

The twin of ``libmember.Sets`` (same methods, same replies, same errors), awaited.
"""

from typing import Any, Dict, List, Optional, Sequence, Union

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from . import _command as cmd
from ._command import Explanation, InfoValue, Item
from .errors import map_error

__all__ = ["Sets", "AsyncSets"]


class Sets:
    """The sets of a libmember server, through ``client`` (a ``redis.asyncio.Redis`` or a
    ``redis.asyncio.cluster.RedisCluster``). Each method is ``libmember.Sets``'s, awaited."""

    def __init__(self, client: Union[Redis, RedisCluster]) -> None:
        if not isinstance(client, (Redis, RedisCluster)):
            raise TypeError(
                "libmember.asyncio.Sets needs redis.asyncio.Redis or "
                "redis.asyncio.cluster.RedisCluster (blocking clients: libmember.Sets)"
            )
        self.client = client

    async def _run(self, command: Union[cmd.Args, cmd.Many]) -> Any:
        """``libmember.Sets._run``, awaited."""
        args = command.args() if isinstance(command, cmd.Many) else command
        try:
            return await self.client.execute_command(*args)
        except ResponseError as e:
            raise map_error(e) from e

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
