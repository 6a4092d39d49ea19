// The package's routing rules against the server's own metadata, on a cluster node: each
// command's routing argument is the first key position of its COMMAND INFO, and keyslot()
// answers as CLUSTER KEYSLOT for every kind of item (hash tags, empty tags, unicode, bytes).
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { ROUTING, keyslot } = require("..");
const { need, address, admin } = require("./support");

const node = address(need("MEMBER_CLUSTER_NODES").split(",")[0]);

test("each command's routing argument is its COMMAND INFO first key", async () => {
  const conn = admin(node);
  try {
    const names = Object.keys(ROUTING);
    const infos = await conn.call("COMMAND", "INFO", ...names);
    for (const [i, name] of names.entries()) {
      const info = infos[i];
      assert.ok(Array.isArray(info), `${name}: the server does not know it`);
      assert.equal(info[3], ROUTING[name], `${name}: first key ${info[3]}, the package routes by argument ${ROUTING[name]}`);
    }
    // And the server has no other public MEMBER.* command that routes by a key.
    const all = (await conn.call("COMMAND", "LIST", "FILTERBY", "PATTERN", "member.*")).map((n) => n.toUpperCase());
    const routed = [];
    for (const name of all.filter((n) => !n.startsWith("MEMBER._"))) {
      const [info] = await conn.call("COMMAND", "INFO", name);
      if (info[3] !== 0) routed.push(name);
    }
    assert.deepEqual(routed.sort(), names.sort());
  } finally {
    conn.disconnect();
  }
});

test("keyslot() answers as CLUSTER KEYSLOT", async () => {
  const conn = admin(node);
  try {
    const items = [
      "alice", "", "{", "}", "{}", "{}x", "a{b}c", "a{}b{c}", "{{a}}", "x{y", "user-7", "  USER-7 ",
      "ａｌｉｃｅ", "Ā", "日本語", "emoji 🙂", "123456789",
      Buffer.from([0xff, 0x00, 0x7b, 0x01, 0x7d]), Buffer.from([0x80, 0x81]),
    ];
    for (let i = 0; i < 300; i++) items.push(`item-${i}-${(i * 7919) % 1000}`);
    for (const item of items) {
      const slot = await conn.call("CLUSTER", "KEYSLOT", item);
      assert.equal(keyslot(item), slot, `keyslot(${JSON.stringify(item)})`);
    }
  } finally {
    conn.disconnect();
  }
});
