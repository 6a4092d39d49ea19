// The MEMBER.* commands as argument lists with their routing argument, and their replies as
// JavaScript values. Pure: no I/O. Options pass through as the server spells them; the server
// validates every value.
"use strict";

/** Each public command's routing argument, as its key spec declares it (`COMMAND INFO`
 * first key; test/commands.test.js checks this table against the server's): 2, the item, for
 * the per-item commands; 1, the set name, for every set-wide one. */
const ROUTING = {
  "MEMBER.ADD": 2,
  "MEMBER.EXISTS": 2,
  "MEMBER.DEL": 2,
  "MEMBER.EXPLAIN": 2,
  "MEMBER.CREATE": 1,
  "MEMBER.ALTER": 1,
  "MEMBER.DROP": 1,
  "MEMBER.REBUILD": 1,
  "MEMBER.INFO": 1,
  "MEMBER.MEXISTS": 1,
  "MEMBER.MADD": 1,
};

/** A command ready to send: its arguments, and the one whose slot picks the node. */
function command(args) {
  const at = ROUTING[args[0]];
  if (at === undefined) throw new Error(`libmember: no routing rule for ${args[0]}`);
  return { args, key: args[at] };
}

/** A settings key as the command's option: `cacheTtl` or `cache_ttl` -> `CACHE-TTL`. */
function optionName(key) {
  return key.replace(/([a-z0-9])([A-Z])/g, "$1-$2").replace(/_/g, "-").toUpperCase();
}

/** A value as an argument: numbers and strings as text, Buffers as given. */
function arg(value) {
  return value instanceof Uint8Array ? value : String(value);
}

/** `settings` as option/value pairs, in the order given; undefined values left out. */
function settingsArgs(settings = {}) {
  const out = [];
  for (const [key, value] of Object.entries(settings)) {
    if (value !== undefined) out.push(optionName(key), arg(value));
  }
  return out;
}

function scopeArgs(scope) {
  return scope === undefined || scope === null ? [] : ["SCOPE", arg(scope)];
}

function expiryArgs({ ttl, expireat } = {}) {
  const out = [];
  if (ttl !== undefined && ttl !== null) out.push("TTL", arg(ttl));
  if (expireat !== undefined && expireat !== null) out.push("EXPIREAT", arg(expireat));
  return out;
}

const create = (name, settings) => command(["MEMBER.CREATE", name, ...settingsArgs(settings)]);

function alter(name, settings = {}) {
  const { sync, ...rest } = settings;
  return command(["MEMBER.ALTER", name, ...settingsArgs(rest), ...(sync ? ["SYNC"] : [])]);
}

const drop = (name, { deleteData } = {}) => command(["MEMBER.DROP", name, ...(deleteData ? ["DELETE-DATA"] : [])]);
const rebuild = (name, { sync } = {}) => command(["MEMBER.REBUILD", name, ...(sync ? ["SYNC"] : [])]);
const info = (name) => command(["MEMBER.INFO", name]);

/** EXISTS, DEL or EXPLAIN of one item. */
const item = (cmd, name, member, { scope } = {}) => command([cmd, name, arg(member), ...scopeArgs(scope)]);

const add = (name, member, options = {}) =>
  command(["MEMBER.ADD", name, arg(member), ...scopeArgs(options.scope), ...expiryArgs(options)]);

const mexists = (name, members, { scope } = {}) =>
  command(["MEMBER.MEXISTS", name, ...scopeArgs(scope), "ITEMS", ...members.map(arg)]);

const madd = (name, members, options = {}) =>
  command(["MEMBER.MADD", name, ...scopeArgs(options.scope), ...expiryArgs(options), "ITEMS", ...members.map(arg)]);

/** A reply string, whatever the client decoded it to. */
function text(value) {
  if (value instanceof Uint8Array) return Buffer.from(value).toString("utf8");
  return String(value);
}

/** Checks an `OK` reply. */
function isOk(reply) {
  if (text(reply) !== "OK") throw new Error(`libmember: expected OK, got ${JSON.stringify(reply)}`);
}

/** An integer reply 0/1 (a number, a bigint or its text) as a boolean. */
function flag(value) {
  return Number(text(value)) === 1;
}

const flags = (reply) => Array.from(reply, flag);

/** MEMBER.EXPLAIN's `[answer, path]` as `{ member, path }`. */
function explanation(reply) {
  const [answer, path] = reply;
  return { member: flag(answer), path: text(path) };
}

// MEMBER.INFO's fields by type (src/command/info.rs; the Python client's _command.py holds
// the same lists). Flags are 0/1 -> boolean; text fields are never read as numbers (a set may
// be named "123"); rates and seconds are numbers; every other field is a number when it reads
// as one, null when empty, and its text otherwise.
const INFO_FLAGS = new Set(["filter_present", "filter_complete", "filter_caught_up", "filter_serves_absent", "auto_grow"]);
const INFO_TEXT = new Set([
  "name", "table", "source", "source_column", "source_scope_column", "sync_mode",
  "source_updated_column", "normalize", "tokenize", "token_key_fp", "token_key",
  "filter_origin", "filter_design", "rebuild_state", "rebuild_reason", "last_rebuild",
  "last_rebuild_error", "rebuild_source", "last_rebuild_reason", "auto_grow_error",
  "cluster_node", "cluster_role", "cluster_poll_error", "sync_horizon", "sync_last_error",
  "node_id", "address", "role", "state",
]);

/** One MEMBER.INFO value, typed by its field. */
function infoValue(field, raw) {
  if (INFO_TEXT.has(field)) return raw;
  if (INFO_FLAGS.has(field) && (raw === "0" || raw === "1")) return raw === "1";
  if (raw === "") return null;
  const n = Number(raw);
  return raw.trim() !== "" && Number.isFinite(n) ? n : raw;
}

/** The field/value pairs of a map reply, however the client gave it: alternating names and
 * values (RESP2), a Map or a plain object (node-redis under RESP3), or GLIDE's
 * `[{ key, value }, …]`. */
function pairs(reply) {
  if (reply instanceof Map) return [...reply.entries()];
  if (Array.isArray(reply)) {
    if (reply.length > 0 && reply.every((e) => e !== null && typeof e === "object" && "key" in e && "value" in e)) {
      return reply.map((e) => [e.key, e.value]);
    }
    const out = [];
    for (let i = 0; i + 1 < reply.length; i += 2) out.push([reply[i], reply[i + 1]]);
    return out;
  }
  if (reply !== null && typeof reply === "object") return Object.entries(reply);
  throw new Error(`libmember: expected a map, got ${JSON.stringify(reply)}`);
}

/** MEMBER.INFO as a plain object; in a cluster `nodes` is an array of such objects. */
function infoObject(reply) {
  const out = {};
  for (const [k, v] of pairs(reply)) {
    const field = text(k);
    out[field] = Array.isArray(v) && field === "nodes" ? v.map(infoObject) : infoValue(field, text(v));
  }
  return out;
}

module.exports = {
  ROUTING, command, optionName, create, alter, drop, rebuild, info, item, add, mexists, madd,
  isOk, flag, flags, explanation, infoObject, text,
};
