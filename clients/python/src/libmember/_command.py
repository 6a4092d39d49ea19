"""The MEMBER.* commands as argument lists, and their replies as Python values.

Pure functions shared by the blocking and the asyncio ``Sets``: no I/O, no state. Options are
passed through as the server spells them; the server validates every value.
"""

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Union

Item = Union[str, bytes]
Args = List[Any]
InfoValue = Union[bool, int, float, str, None, List[Dict[str, Any]]]


class Explanation(NamedTuple):
    """MEMBER.EXPLAIN's reply: the answer EXISTS would give, and the tier that decided it
    (``bloom-negative``, ``recent``, ``cache-hit``, ``fp-cache``, ``db-hit`` or ``db-miss``)."""

    answer: bool
    path: str


# The argument each command is routed by in a cluster, as the server declares it (COMMAND's
# first key position, `src/command/table.rs`): the item for the per-item commands, the set name
# for the rest. tests/test_routing.py checks it against the server's COMMAND INFO.
ROUTING_ARG = {
    "MEMBER.ADD": 2,
    "MEMBER.EXISTS": 2,
    "MEMBER.DEL": 2,
    "MEMBER.EXPLAIN": 2,
    "MEMBER.CREATE": 1,
    "MEMBER.ALTER": 1,
    "MEMBER.DROP": 1,
    "MEMBER.MEXISTS": 1,
    "MEMBER.MADD": 1,
    "MEMBER.INFO": 1,
    "MEMBER.REBUILD": 1,
}


def routing_key(args: Args) -> Item:
    """The argument ``args`` (a whole command) is routed by."""
    return args[ROUTING_ARG[args[0]]]


def option_name(keyword: str) -> str:
    """A Python keyword as the command's option: ``cache_ttl`` -> ``CACHE-TTL``."""
    return keyword.upper().replace("_", "-")


def settings_args(settings: Dict[str, Any]) -> Args:
    """Keyword settings as option/value pairs, in the order given."""
    out: Args = []
    for key, value in settings.items():
        out += [option_name(key), value]
    return out


def create(name: str, settings: Dict[str, Any]) -> Args:
    return ["MEMBER.CREATE", name, *settings_args(settings)]


def alter(name: str, sync: bool, settings: Dict[str, Any]) -> Args:
    return ["MEMBER.ALTER", name, *settings_args(settings), *(["SYNC"] if sync else [])]


def drop(name: str, delete_data: bool) -> Args:
    return ["MEMBER.DROP", name, *(["DELETE-DATA"] if delete_data else [])]


def rebuild(name: str, sync: bool) -> Args:
    return ["MEMBER.REBUILD", name, *(["SYNC"] if sync else [])]


def info(name: str) -> Args:
    return ["MEMBER.INFO", name]


def _scope(scope: Optional[Item]) -> Args:
    return [] if scope is None else ["SCOPE", scope]


def _expiry(ttl: Optional[int], expireat: Optional[int]) -> Args:
    out: Args = []
    if ttl is not None:
        out += ["TTL", ttl]
    if expireat is not None:
        out += ["EXPIREAT", expireat]
    return out


def item(command: str, name: str, member: Item, scope: Optional[Item]) -> Args:
    """EXISTS, DEL or EXPLAIN of one item."""
    return [command, name, member, *_scope(scope)]


def add(
    name: str, member: Item, scope: Optional[Item], ttl: Optional[int], expireat: Optional[int]
) -> Args:
    return ["MEMBER.ADD", name, member, *_scope(scope), *_expiry(ttl, expireat)]


class Many(NamedTuple):
    """MEXISTS or MADD: options that apply to every item, then the items."""

    command: str
    name: str
    options: Args
    items: Sequence[Item]

    def args(self) -> Args:
        return [self.command, self.name, *self.options, "ITEMS", *self.items]


def mexists(name: str, members: Sequence[Item], scope: Optional[Item]) -> Many:
    return Many("MEMBER.MEXISTS", name, _scope(scope), members)


def madd(
    name: str,
    members: Sequence[Item],
    scope: Optional[Item],
    ttl: Optional[int],
    expireat: Optional[int],
) -> Many:
    return Many("MEMBER.MADD", name, [*_scope(scope), *_expiry(ttl, expireat)], members)


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the cluster's slot hash."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        crc &= 0xFFFF
    return crc


def keyslot(key: bytes) -> int:
    """The cluster slot of ``key``, as the server computes it: the part between the first
    ``{`` and the next ``}`` when that part is not empty, else the whole key."""
    start = key.find(b"{")
    if start != -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key) % 16384


def text(value: Any) -> str:
    """A reply string, whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else str(value)


def is_ok(reply: Any) -> None:
    """Checks an ``OK`` reply (redis-py may give ``True``, ``"OK"`` or ``b"OK"``)."""
    if reply is not True and text(reply) != "OK":
        raise ValueError(f"expected OK, got {reply!r}")


def flags(reply: Sequence[Any]) -> List[bool]:
    return [bool(int(v)) for v in reply]


def explanation(reply: Sequence[Any]) -> Explanation:
    answer, path = reply
    return Explanation(bool(int(answer)), text(path))


# MEMBER.INFO's fields by type (src/command/info.rs). Flags are 0/1 -> bool; text fields are
# never read as numbers (a set may be named "123"); rates and seconds are floats; every other
# field is an int when it reads as one (a field added later: a float when it reads as one),
# None when empty (sync_watermark_xid before the first sync), and its text otherwise ("never"
# for sync_age_ms before the first sync, "all" for cluster_slots_covered outside a cluster).
INFO_FLAGS = frozenset(
    ["filter_present", "filter_complete", "filter_caught_up", "filter_serves_absent", "auto_grow"]
)
INFO_TEXT = frozenset(
    [
        "name", "table", "source", "source_column", "source_scope_column", "sync_mode",
        "source_updated_column", "normalize", "tokenize", "token_key_fp", "token_key",
        "filter_origin", "filter_design", "rebuild_state", "rebuild_reason", "last_rebuild",
        "last_rebuild_error", "rebuild_source", "last_rebuild_reason", "auto_grow_error",
        "cluster_node", "cluster_role", "cluster_poll_error", "sync_horizon", "sync_last_error",
        "node_id", "address", "role", "state",
    ]
)  # fmt: skip
INFO_FLOATS = frozenset(
    [
        "error_rate", "filter_error_rate", "filter_fill", "filter_fpr_est",
        "filter_static_fpr_est", "filter_delta_fpr_est", "rebuild_percent", "rebuild_elapsed_s",
        "last_rebuild_s", "bloom_exists_true_rate", "db_fallback_rate", "false_positive_rate_est",
    ]
)  # fmt: skip


def info_value(field: str, raw: str) -> InfoValue:
    """One MEMBER.INFO value, typed by its field (see the tables above)."""
    if field in INFO_TEXT:
        return raw
    if field in INFO_FLAGS and raw in ("0", "1"):
        return raw == "1"
    if raw == "":
        return None
    for number in (float,) if field in INFO_FLOATS else (int, float):
        try:
            return number(raw)
        except ValueError:
            pass
    return raw


def info_dict(reply: Any) -> Dict[str, InfoValue]:
    """MEMBER.INFO's alternating names and values (or a RESP3 map) as a typed dict. In a
    cluster, ``nodes`` is a list of such dicts, one per node."""
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {
        text(k): (
            [info_dict(n) for n in v] if isinstance(v, list) else info_value(text(k), text(v))
        )
        for k, v in pairs
    }
