"""libmember: a thin Python client for the libmember Valkey module (MEMBER.* commands).

``Sets(client)`` over a blocking client (redis-py, valkey-py or valkey-glide's sync client,
standalone or cluster); ``libmember.asyncio.Sets`` over their asyncio twins. In a cluster every
call goes straight to the primary that serves it. Typed errors: ``Unavailable`` (retryable),
``NoSuchSet``, ``NoPermission``, all redis-py ``ResponseError``s (and, over valkey-py or GLIDE,
that library's own error class too).
"""

from ._command import Explanation
from .errors import NoPermission, NoSuchSet, Unavailable
from .sets import Sets

__all__ = ["Sets", "Explanation", "Unavailable", "NoSuchSet", "NoPermission"]
__version__ = "0.1.0"
