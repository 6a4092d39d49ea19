"""libmember: a thin Python client for the libmember Valkey module (MEMBER.* commands).

``Sets(client)`` over ``redis.Redis`` or ``redis.cluster.RedisCluster``;
``libmember.asyncio.Sets`` over their asyncio twins. Typed errors: ``Unavailable``
(retryable), ``NoSuchSet``, ``NoPermission``, all redis-py ``ResponseError``s.
"""

from ._command import Explanation
from .errors import NoPermission, NoSuchSet, Unavailable
from .sets import Sets

__all__ = ["Sets", "Explanation", "Unavailable", "NoSuchSet", "NoPermission"]
__version__ = "0.1.0"
