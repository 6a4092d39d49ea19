// The package's pure parts, with no server: the slot function, option names, argument lists,
// reply shapes of every library, and the error mapping on each library's error texts.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { keyslot, Unavailable, NoSuchSet, NoPermission, MemberError } = require("..");
const cmd = require("../lib/commands");
const { mapError } = require("../lib/errors");
const { keyForSlot, SLOTS } = require("../lib/slot");
const { transportFor } = require("../lib/transport");

test("keyslot: the CRC16 check value and hash tags", () => {
  assert.equal(keyslot("123456789"), 0x31c3 & 0x3fff);
  assert.equal(keyslot("foo"), 12182);
  assert.equal(keyslot("{user1000}.following"), keyslot("user1000"));
  assert.equal(keyslot("{}x"), keyslot(Buffer.from("{}x")));
  assert.equal(keyslot("a{}b{c}"), keyslot(Buffer.from("a{}b{c}")));
  assert.equal(keyslot("x{y}"), keyslot("y"));
  assert.equal(keyslot(42), keyslot("42"));
});

test("keyForSlot: a short text key of every slot", () => {
  for (let slot = 0; slot < SLOTS; slot++) {
    const key = keyForSlot(slot);
    assert.equal(keyslot(key), slot);
    assert.match(key, /^\{[0-9a-zA-Z]{1,4}\}$/);
  }
});

test("option names and argument lists, with their routing argument", () => {
  assert.equal(cmd.optionName("cacheTtl"), "CACHE-TTL");
  assert.equal(cmd.optionName("cache_ttl"), "CACHE-TTL");
  assert.equal(cmd.optionName("scopeColumn"), "SCOPE-COLUMN");
  assert.deepEqual(cmd.create("s", { normalize: "username", capacity: 5, recentTtl: 9 }), {
    args: ["MEMBER.CREATE", "s", "NORMALIZE", "username", "CAPACITY", "5", "RECENT-TTL", "9"],
    key: "s",
  });
  assert.deepEqual(cmd.alter("s", { cacheTtl: 5, sync: true }).args, ["MEMBER.ALTER", "s", "CACHE-TTL", "5", "SYNC"]);
  assert.deepEqual(cmd.drop("s", { deleteData: true }).args, ["MEMBER.DROP", "s", "DELETE-DATA"]);
  assert.deepEqual(cmd.add("s", "x", { scope: "m", ttl: 5 }), {
    args: ["MEMBER.ADD", "s", "x", "SCOPE", "m", "TTL", "5"],
    key: "x",
  });
  assert.deepEqual(cmd.item("MEMBER.EXISTS", "s", "x", {}).key, "x");
  assert.deepEqual(cmd.madd("s", ["a", "b"], { expireat: 7 }), {
    args: ["MEMBER.MADD", "s", "EXPIREAT", "7", "ITEMS", "a", "b"],
    key: "s",
  });
  assert.deepEqual(cmd.mexists("s", ["a"], { scope: "m" }).key, "s");
  assert.throws(() => cmd.command(["MEMBER.NOPE", "s"]), /no routing rule/);
});

test("INFO typed from every library's map shape", () => {
  const flat = ["name", "123", "filter_complete", "1", "error_rate", "0.01", "filter_items", "7", "sync_watermark_xid", "", "sync_age_ms", "never"];
  const want = { name: "123", filter_complete: true, error_rate: 0.01, filter_items: 7, sync_watermark_xid: null, sync_age_ms: "never" };
  assert.deepEqual(cmd.infoObject(flat), want);
  const entries = [];
  for (let i = 0; i < flat.length; i += 2) entries.push([flat[i], flat[i + 1]]);
  assert.deepEqual(cmd.infoObject(new Map(entries)), want);
  assert.deepEqual(cmd.infoObject(Object.fromEntries(entries)), want);
  assert.deepEqual(cmd.infoObject(entries.map(([key, value]) => ({ key, value }))), want);
  // Integers as RESP3 gives them, and a cluster's nodes.
  assert.deepEqual(cmd.infoObject([{ key: "cluster_nodes", value: 6 }, { key: "nodes", value: [[{ key: "role", value: "primary" }]] }]), {
    cluster_nodes: 6,
    nodes: [{ role: "primary" }],
  });
  assert.deepEqual(cmd.explanation([1, "db-hit"]), { member: true, path: "db-hit" });
  assert.deepEqual(cmd.flags([1, 0, "1", 0n]), [true, false, true, false]);
});

class ReplyError extends Error {}
class RequestError extends Error {}

test("error replies as each library gives them", () => {
  const cases = [
    // ioredis, iovalkey and node-redis: the reply whole.
    [new ReplyError("UNAVAILABLE source of truth did not answer within member.db-timeout-ms"), Unavailable, "UNAVAILABLE source of truth did not answer within member.db-timeout-ms"],
    [new ReplyError("ERR no such set: create it with MEMBER.CREATE"), NoSuchSet, "ERR no such set: create it with MEMBER.CREATE"],
    [new ReplyError("NOPERM this user may not write set 's'"), NoPermission, "NOPERM this user may not write set 's'"],
    [new ReplyError("ERR SOURCE table is not allowed by member.attach-allow: x"), NoPermission, "ERR SOURCE table is not allowed by member.attach-allow: x"],
    // GLIDE: the code named by its kind, or an unknown code before a colon.
    [new RequestError("An error was signalled by the server: - ResponseError: no such set: create it with MEMBER.CREATE"), NoSuchSet, "ERR no such set: create it with MEMBER.CREATE"],
    [new RequestError("UNAVAILABLE: source of truth unavailable: x"), Unavailable, "UNAVAILABLE source of truth unavailable: x"],
  ];
  for (const [err, Class, text] of cases) {
    const mapped = mapError(err);
    assert.ok(mapped instanceof Class && mapped instanceof MemberError, `${err.message}`);
    assert.equal(mapped.message, text);
    assert.equal(mapped.cause, err);
  }
  for (const err of [new ReplyError("ERR item is empty"), new ReplyError("TRYAGAIN libmember: no node serves the item's canonical slot; retry"), new Error("Connection is closed.")]) {
    assert.equal(mapError(err), err);
  }
});

test("a client the package does not know is refused at once", () => {
  for (const client of [null, {}, { get() {} }, "redis://x"]) {
    assert.throws(() => transportFor(client), TypeError);
  }
});
