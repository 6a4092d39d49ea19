"""How a command reaches a cluster today, for the commands the server does not route yet.

Temporary by design: the server will route every MEMBER.* command by itself
(docs/cluster-commands.md). When a command declares its routing argument, delete its row;
when the table is empty, delete this file and the cluster branch of ``Sets._run`` (blocking
and asyncio). Commands without a row (ADD, EXISTS, DEL, EXPLAIN by the item; CREATE, ALTER,
DROP, REBUILD by the set name) are sent as they are, and redis-py's cluster client routes
them.
"""

from typing import Any, Dict, List, Optional, Tuple

# MEMBER.INFO declares no key: ask the node that serves the set name's slot (where CREATE,
# ALTER and DROP of the set go).
SET_NAME_NODE = "set-name-node"
# MEXISTS and MADD are refused in cluster mode: one pipeline of the single-item command,
# each call routed by its item (the server will fan them out itself).
PER_ITEM = "per-item"

# command -> (how, the single-item command for PER_ITEM)
CLUSTER_ROUTES: Dict[str, Tuple[str, Optional[str]]] = {
    "MEMBER.INFO": (SET_NAME_NODE, None),
    "MEMBER.MEXISTS": (PER_ITEM, "MEMBER.EXISTS"),
    "MEMBER.MADD": (PER_ITEM, "MEMBER.ADD"),
}


def route(command: str) -> Tuple[Optional[str], Optional[str]]:
    """How ``command`` goes in cluster mode (a constant above, or None: as it is), and for
    ``PER_ITEM`` the single-item command that replaces it."""
    return CLUSTER_ROUTES.get(command, (None, None))


def per_item_reply(replies: List[Any]) -> List[Any]:
    """The pipeline's replies, one per item in the order given; the first error raised."""
    for r in replies:
        if isinstance(r, Exception):
            raise r
    return replies
