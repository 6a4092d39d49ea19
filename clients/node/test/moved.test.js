// Slots that move under a client's feet: each library's cluster client (MEMBER_CLIENTS) learns
// the slot map, then 20 slots move to another primary (`<cli> --cluster reshard`, MEMBER_CLI),
// and every call on their items still answers right. The client's stale map sends them to the
// old owner, which answers MOVED; the library follows it and refreshes its map, and no MOVED
// reaches the caller.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { execFileSync } = require("node:child_process");
const { Sets } = require("..");
const { keyForSlot } = require("../lib/slot");
const { need, address, libraries, admin, movedCount, eventually } = require("./support");

const seed = address(need("MEMBER_CLUSTER"));
const nodes = need("MEMBER_CLUSTER_NODES").split(",").map(address);
const cli = need("MEMBER_CLI");
const MOVING = 20;

/** The primaries' slot ranges: [[first, last, "host:port"], …]. */
async function slotMap() {
  const conn = admin(seed);
  try {
    return (await conn.call("CLUSTER", "SLOTS")).map(([first, last, [host, port]]) => [first, last, `${host}:${port}`]);
  } finally {
    conn.disconnect();
  }
}

async function nodeId(addr) {
  const conn = admin(address(addr));
  try {
    return await conn.call("CLUSTER", "MYID");
  } finally {
    conn.disconnect();
  }
}

for (const [lib, connect] of libraries()) {
  test(`${lib}: calls on moved slots answer right, with no MOVED surfaced`, async (t) => {
    const { client, close } = await connect({ ...seed, cluster: true });
    try {
      const sets = new Sets(client);
      const name = `${lib}_r`;
      await sets.create(name);
      await eventually(`every primary holds a filter of ${name}`, async () => {
        const primaries = (await sets.info(name)).nodes.filter((n) => n.role === "primary");
        return primaries.length === 3 && primaries.every((n) => n.filter_present === true);
      });
      // The reshard takes the source's lowest slots: those are the ones that move.
      const map = await slotMap();
      const [from, to] = [...new Set(map.map((r) => r[2]))].sort();
      const slots = map
        .filter((r) => r[2] === from)
        .flatMap(([first, last]) => Array.from({ length: last - first + 1 }, (_, i) => first + i))
        .sort((a, b) => a - b)
        .slice(0, MOVING);
      const members = slots.map((s) => `before${keyForSlot(s)}`);
      const fresh = slots.map((s) => `after${keyForSlot(s)}`);
      assert.deepEqual(await Promise.all(members.map((i) => sets.add(name, i))), members.map(() => true));
      assert.deepEqual(await Promise.all(members.map((i) => sets.exists(name, i))), members.map(() => true));

      const [fromId, toId] = [await nodeId(from), await nodeId(to)];
      execFileSync(cli, ["--cluster", "reshard", from, "--cluster-from", fromId, "--cluster-to", toId,
        "--cluster-slots", String(MOVING), "--cluster-yes"], { stdio: "ignore" });
      const now = await slotMap();
      for (const s of slots) {
        assert.equal(now.find(([first, last]) => first <= s && s <= last)[2], to, `slot ${s} moved`);
      }

      const moved = await movedCount(nodes);
      assert.deepEqual(await Promise.all(members.map((i) => sets.exists(name, i))), members.map(() => true));
      assert.deepEqual(await Promise.all(fresh.map((i) => sets.exists(name, i))), fresh.map(() => false));
      assert.deepEqual(await Promise.all(fresh.map((i) => sets.add(name, i))), fresh.map(() => true));
      assert.deepEqual(await Promise.all(fresh.map((i) => sets.del(name, i))), fresh.map(() => true));
      assert.deepEqual(await sets.mexists(name, members), members.map(() => true));
      const followed = (await movedCount(nodes)) - moved;
      t.diagnostic(`${lib} after ${MOVING} slots moved: ${followed} MOVED answered and followed by the library, none surfaced`);
      await sets.drop(name, { deleteData: true });
    } finally {
      await close();
    }
  });
}
