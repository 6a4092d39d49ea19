"""How a command reaches a cluster today, for the commands the server does not route yet.

Temporary by design: the server will route every MEMBER.* command by itself
(docs/cluster-commands.md). When a command declares its routing argument, delete its row;
when the table is empty, delete this file and the cluster branch of ``Sets._run`` (blocking
and asyncio). Commands without a row (ADD, EXISTS, DEL, EXPLAIN by the item; CREATE, ALTER,
DROP, REBUILD, MEXISTS, MADD by the set name) are sent as they are, and redis-py's cluster
client routes them.
"""

from typing import Dict, Optional

# MEMBER.INFO declares no key: ask the node that serves the set name's slot (where CREATE,
# ALTER and DROP of the set go).
SET_NAME_NODE = "set-name-node"
# command -> how
CLUSTER_ROUTES: Dict[str, str] = {
    "MEMBER.INFO": SET_NAME_NODE,
}


def route(command: str) -> Optional[str]:
    """How ``command`` goes in cluster mode (a constant above, or None: as it is)."""
    return CLUSTER_ROUTES.get(command)
