// Sets over each library's cluster client (MEMBER_CLIENTS), started from the node
// MEMBER_CLUSTER names (a replica): every method across slots, and no MOVED on any node of
// MEMBER_CLUSTER_NODES for 1 000 EXISTS, 1 000 ADD and 100 EXISTS sent at once. The package
// sends each call to the primary of its routing argument's slot; one sent anywhere else is
// answered MOVED, which `INFO errorstats` counts, so wrong routing fails here.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { Sets, keyslot, NoSuchSet } = require("..");
const { need, address, libraries, admin, movedCount, eventually } = require("./support");

const seed = address(need("MEMBER_CLUSTER"));
const nodes = need("MEMBER_CLUSTER_NODES").split(",").map(address);

/** The slot ranges of the primaries, from CLUSTER SLOTS: [[first, last, "host:port"], …]. */
async function slotMap() {
  const conn = admin(seed);
  try {
    return (await conn.call("CLUSTER", "SLOTS")).map(([first, last, [host, port]]) => [first, last, `${host}:${port}`]);
  } finally {
    conn.disconnect();
  }
}

const primaryOf = (map, item) => map.find(([first, last]) => first <= keyslot(item) && keyslot(item) <= last)[2];

/** info() once every primary holds a filter of the set (those that learned it from the
 * catalog build theirs in the background). */
const infoOnceReady = (sets, name) =>
  eventually(`every primary holds a filter of ${name}`, async () => {
    const info = await sets.info(name);
    const primaries = info.nodes.filter((n) => n.role === "primary");
    return primaries.length === 3 && primaries.every((n) => n.filter_present === true) ? info : null;
  });

/** `count` calls of `call(i)`, `width` at a time. */
async function inWaves(count, width, call) {
  const out = [];
  for (let start = 0; start < count; start += width) {
    const wave = [];
    for (let i = start; i < Math.min(count, start + width); i++) wave.push(call(i));
    out.push(...(await Promise.all(wave)));
  }
  return out;
}

for (const [lib, connect] of libraries()) {
  test(`${lib}: every method across slots, from a replica`, async () => {
    const { client, close } = await connect({ ...seed, cluster: true });
    try {
      const sets = new Sets(client);
      assert.equal(sets.transport.cluster, true);
      const name = `${lib}_c`;
      const map = await slotMap();
      const items = Array.from({ length: 30 }, (_, i) => `user-${i}`);
      assert.equal(new Set(items.map((i) => primaryOf(map, i))).size, 3, "the items span every primary");
      const before = await movedCount(nodes);

      await sets.create(name, { normalize: "lower", capacity: 10000, cacheTtl: 300 });
      await infoOnceReady(sets, name);
      assert.deepEqual(await Promise.all(items.map((i) => sets.add(name, i))), items.map(() => true));
      assert.deepEqual(await Promise.all(items.map((i) => sets.exists(name, i))), items.map(() => true));
      assert.equal(await sets.add(name, "user-0"), false);
      assert.equal(await sets.exists(name, "nobody"), false);
      // A spelling whose canonical form lives on another node: forwarded by the server.
      assert.equal(await sets.exists(name, "  USER-7 "), true);
      // Hash tags, unicode and bytes route by the slot the server computes.
      for (const item of ["{tag}one", "a{}b", "ünïcödé", Buffer.from([0xe2, 0x82, 0xac])]) {
        assert.equal(await sets.add(name, item), true);
        assert.equal(await sets.exists(name, item), true);
      }
      assert.deepEqual(await sets.explain(name, "user-3"), { member: true, path: (await sets.explain(name, "user-3")).path });
      assert.equal((await sets.explain(name, "absent-9")).member, false);
      assert.deepEqual(await sets.mexists(name, ["user-1", "absent-1", "user-29", "absent-2"]), [true, false, true, false]);
      const fresh = Array.from({ length: 12 }, (_, i) => `new-${i}`);
      assert.deepEqual(await sets.madd(name, [...fresh, "user-3"]), [...fresh.map(() => true), false]);
      assert.deepEqual(await sets.mexists(name, fresh), fresh.map(() => true));
      assert.equal(await sets.del(name, "new-0"), true);
      assert.equal(await sets.exists(name, "new-0"), false);
      assert.equal(await sets.add(name, "card", { scope: "m1", ttl: 600 }), true);
      assert.equal(await sets.exists(name, "card", { scope: "m1" }), true);
      assert.equal(await sets.exists(name, "card"), false);

      const info = await sets.info(name);
      assert.equal(info.name, name);
      assert.equal(info.cluster_nodes, 6);
      assert.equal(info.nodes.length, 6);
      assert.equal(info.cluster_slots_owned, 16384);
      assert.equal(info.filter_items, 30 + 4 + 12 + 1);
      await sets.alter(name, { cacheTtl: 60 });
      assert.equal((await sets.info(name)).cache_ttl, 60);
      assert.equal(await sets.rebuild(name, { sync: true }), 30 + 4 + 11 + 1);
      await eventually("the rebuild is over", async () => (await sets.info(name)).nodes.every((n) => n.rebuild_state !== "running"));
      assert.equal(await sets.rebuild(name), null);
      await sets.drop(name, { deleteData: true });
      await assert.rejects(sets.create(name, { error: 2 }), /ERROR must be a number/);
      assert.equal(await movedCount(nodes), before, "MOVED answered to the package's calls");
      await eventually("every node forgot the set", async () => {
        try {
          await sets.info(name);
          return false;
        } catch (e) {
          return e instanceof NoSuchSet;
        }
      });
    } finally {
      await close();
    }
  });

  test(`${lib}: no MOVED per 1 000 EXISTS, 1 000 ADD, and 100 EXISTS at once`, async (t) => {
    const { client, close } = await connect({ ...seed, cluster: true });
    try {
      const sets = new Sets(client);
      const name = `${lib}_m`;
      await sets.create(name);
      await infoOnceReady(sets, name);
      const added = Array.from({ length: 1000 }, (_, i) => `m-${i}`);
      const asked = Array.from({ length: 1000 }, (_, i) => (i % 2 ? `m-${i}` : `absent-${i}`));

      let from = await movedCount(nodes);
      assert.deepEqual(await inWaves(1000, 10, (i) => sets.add(name, added[i])), added.map(() => true));
      const adds = (await movedCount(nodes)) - from;

      from = await movedCount(nodes);
      assert.deepEqual(await inWaves(1000, 10, (i) => sets.exists(name, asked[i])), asked.map((_, i) => i % 2 === 1));
      const exists = (await movedCount(nodes)) - from;

      from = await movedCount(nodes);
      const hundred = asked.slice(0, 100);
      assert.deepEqual(await Promise.all(hundred.map((i) => sets.exists(name, i))), hundred.map((_, i) => i % 2 === 1));
      const pipeline = (await movedCount(nodes)) - from;

      t.diagnostic(`${lib} MOVED per 1000 EXISTS: ${exists}, per 1000 ADD: ${adds}, pipeline of 100 EXISTS: ${pipeline}`);
      assert.deepEqual({ exists, adds, pipeline }, { exists: 0, adds: 0, pipeline: 0 });

      if (lib.startsWith("io")) {
        // ioredis' auto-pipelining groups a cluster's commands by their first argument: the
        // package's calls keep out of it, so they still go to their items' nodes.
        const auto = await connect({ ...seed, cluster: true, autoPipelining: true });
        try {
          const autoSets = new Sets(auto.client);
          from = await movedCount(nodes);
          assert.deepEqual(await Promise.all(hundred.map((i) => autoSets.exists(name, i))), hundred.map((_, i) => i % 2 === 1));
          assert.equal((await movedCount(nodes)) - from, 0, "MOVED with enableAutoPipelining");
        } finally {
          await auto.close();
        }
      }
      await sets.drop(name, { deleteData: true });
    } finally {
      await close();
    }
  });
}
