// Types of the libmember package (index.js). Hand-written beside the plain JavaScript: no
// build step. Client types are structural, so no client library is needed to compile.

/** An item or a scope: text (sent as UTF-8), or bytes as given. */
export type Item = string | Buffer | Uint8Array;

/** A client the package accepts: an ioredis or iovalkey `Redis` or `Cluster`, a node-redis
 * client or cluster (`createClient`, `createCluster`; 5.x and 6.x), or a GLIDE `GlideClient`
 * or `GlideClusterClient`. Recognized by its methods; anything else is a `TypeError`. */
export type Client =
  | { call(...args: any[]): Promise<unknown>; sendCommand(...args: any[]): unknown; isCluster: boolean }
  | { sendCommand(...args: any[]): Promise<unknown> }
  | { customCommand(args: any[], options?: any): Promise<unknown> };

/** CREATE's settings: each becomes its option (`cacheTtl` or `cache_ttl` -> `CACHE-TTL`).
 * The server checks every value (docs/commands.md). */
export interface CreateSettings {
  error?: number;
  capacity?: number;
  cacheTtl?: number;
  recentTtl?: number;
  normalize?: "none" | "lower" | "username";
  tokenize?: "none" | "hmac-sha256";
  /** An attached table: `schema.table`, with `column` and the rest of CREATE … SOURCE. */
  source?: string;
  column?: string;
  scopeColumn?: string;
  sync?: string;
  updatedColumn?: string;
  [option: string]: string | number | undefined;
}

/** ALTER's settings; `sync: true` returns once the filter built with them serves. */
export interface AlterSettings {
  error?: number;
  capacity?: number;
  cacheTtl?: number;
  recentTtl?: number;
  sync?: boolean;
}

export interface ScopeOption {
  scope?: Item;
}

/** `ttl` (seconds) or `expireat` (unix seconds) make a membership expire; not both. */
export interface AddOptions extends ScopeOption {
  ttl?: number;
  expireat?: number;
}

/** MEMBER.EXPLAIN: the answer EXISTS would give, and the tier that decided it. */
export interface Explanation {
  member: boolean;
  path: "bloom-negative" | "recent" | "cache-hit" | "fp-cache" | "db-hit" | "db-miss" | string;
}

/** One MEMBER.INFO value: flags as booleans, counts and rates as numbers, words as strings,
 * null when empty. */
export type InfoValue = boolean | number | string | null;

/** MEMBER.INFO as a plain object. In a cluster, `nodes` holds each node's own fields
 * (`node_id`, `address`, `role`, `state`, then its MEMBER.INFO fields). */
export interface Info {
  [field: string]: InfoValue | Info[] | undefined;
  nodes?: Info[];
}

/** The sets of a libmember server, through `client`. Each per-item call (add, exists, del,
 * explain) goes to the primary of the item's slot, every other call to the primary of the set
 * name's slot; calls made at once go out together on each node's connection. */
export class Sets {
  constructor(client: Client);
  readonly client: Client;
  /** Which kind of client this is and whether it is a cluster client. */
  readonly transport: { kind: "ioredis" | "node-redis" | "glide"; cluster: boolean };
  /** MEMBER.CREATE: resolves once the set exists and its filter is built. Creating an
   * existing set with the same settings is fine. */
  create(name: string, settings?: CreateSettings): Promise<void>;
  /** MEMBER.ALTER. */
  alter(name: string, settings: AlterSettings): Promise<void>;
  /** MEMBER.DROP; `deleteData` drops the set's table too. */
  drop(name: string, options?: { deleteData?: boolean }): Promise<void>;
  /** MEMBER.ADD: true when this call made `item` a member, false when it already was one. */
  add(name: string, item: Item, options?: AddOptions): Promise<boolean>;
  /** MEMBER.EXISTS: whether `item` is a member, as the database says. */
  exists(name: string, item: Item, options?: ScopeOption): Promise<boolean>;
  /** MEMBER.DEL: true when `item` was a member and is removed. */
  del(name: string, item: Item, options?: ScopeOption): Promise<boolean>;
  /** MEMBER.EXPLAIN: the answer and the tier of the funnel that decided it. */
  explain(name: string, item: Item, options?: ScopeOption): Promise<Explanation>;
  /** MEMBER.MEXISTS (at most 1000 items): one answer per item, in the order given. */
  mexists(name: string, items: readonly Item[], options?: ScopeOption): Promise<boolean[]>;
  /** MEMBER.MADD (at most 1000 items): true for each item this call made a member. In a
   * cluster an error may leave some items added: repeat the call. */
  madd(name: string, items: readonly Item[], options?: AddOptions): Promise<boolean[]>;
  /** MEMBER.INFO as a typed object (in a cluster: the set over every node, and `nodes`). */
  info(name: string): Promise<Info>;
  /** MEMBER.REBUILD: null once started; with `sync` the number of members loaded (in a
   * cluster, summed over the primaries). */
  rebuild(name: string, options?: { sync?: false }): Promise<null>;
  rebuild(name: string, options: { sync: true }): Promise<number>;
}

/** An error reply libmember names. `message` and `reply` are the reply as the server sent it;
 * `cause` is the client library's own error. */
export class MemberError extends Error {
  readonly reply: string;
  readonly cause: unknown;
  readonly retryable: boolean;
}

/** `UNAVAILABLE …`: PostgreSQL did not answer in time. Never a wrong answer: retry later
 * (`retryable` is true); a write may or may not have happened, and repeating it is safe. */
export class Unavailable extends MemberError {
  readonly retryable: true;
}

/** `ERR no such set…`: create the set first. */
export class NoSuchSet extends MemberError {
  readonly retryable: false;
}

/** `NOPERM …` (the module's per-set refusal or the server's own), or a `SOURCE` table that
 * `member.attach-allow` does not list. */
export class NoPermission extends MemberError {
  readonly retryable: false;
}

/** The cluster hash slot of a routing argument, 0..16383, as the server computes it. */
export function keyslot(key: Item | number): number;

/** Each command's routing argument (2: the item; 1: the set name), as its key spec declares. */
export const ROUTING: Readonly<Record<string, 1 | 2>>;
