// Every method of Sets over each library's standalone client (MEMBER_CLIENTS) against the
// server MEMBER_URL names: typed answers, typed INFO, and the NoSuchSet and NoPermission errors.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { Sets, MemberError, NoSuchSet, NoPermission } = require("..");
const { need, address, libraries, admin } = require("./support");

const server = address(need("MEMBER_URL"));

for (const [lib, connect] of libraries()) {
  test(`${lib}: every method`, async () => {
    const { client, close } = await connect(server);
    try {
      const sets = new Sets(client);
      assert.deepEqual(sets.transport.cluster, false);
      const name = `${lib}_users`;
      await sets.create(name, { normalize: "username", capacity: 10000, error: 0.001, cacheTtl: 300 });
      await sets.create(name, { normalize: "username", capacity: 10000, error: 0.001, cacheTtl: 300 });
      assert.equal(await sets.add(name, "Alice "), true);
      assert.equal(await sets.add(name, "alice"), false);
      assert.equal(await sets.exists(name, "ALICE"), true);
      assert.equal(await sets.exists(name, "bob"), false);
      assert.deepEqual(await sets.explain(name, "bob"), { member: false, path: "bloom-negative" });
      const explained = await sets.explain(name, "alice");
      assert.equal(explained.member, true);
      assert.ok(["recent", "cache-hit", "db-hit"].includes(explained.path), explained.path);
      // Binary-safe: a Buffer item is sent as its bytes.
      assert.equal(await sets.add(name, Buffer.from("carol")), true);
      assert.equal(await sets.exists(name, "carol"), true);
      assert.deepEqual(await sets.madd(name, ["dave", "erin", "alice"]), [true, true, false]);
      assert.deepEqual(await sets.mexists(name, ["dave", "nobody", "erin"]), [true, false, true]);
      assert.deepEqual(await sets.mexists(name, []), []);
      assert.deepEqual(await sets.madd(name, []), []);
      assert.equal(await sets.del(name, "dave"), true);
      assert.equal(await sets.del(name, "dave"), false);
      assert.equal(await sets.exists(name, "dave"), false);
      // Scopes and expiries.
      assert.equal(await sets.add(name, "card", { scope: "m1", ttl: 600 }), true);
      assert.equal(await sets.exists(name, "card", { scope: "m1" }), true);
      assert.equal(await sets.exists(name, "card", { scope: "m2" }), false);
      assert.equal(await sets.exists(name, "card"), false);
      const later = Math.floor(Date.now() / 1000) + 3600;
      assert.deepEqual(await sets.madd(name, ["a", "b"], { scope: "m2", expireat: later }), [true, true]);
      assert.deepEqual(await sets.mexists(name, ["a", "b", "card"], { scope: "m2" }), [true, true, false]);
      // Many calls at once share the connection, each answered in order.
      const many = Array.from({ length: 100 }, (_, i) => `many-${i}`);
      assert.deepEqual(await Promise.all(many.map((i) => sets.add(name, i))), many.map(() => true));
      assert.deepEqual(await Promise.all(many.map((i) => sets.exists(name, i))), many.map(() => true));

      const info = await sets.info(name);
      assert.equal(info.name, name);
      assert.equal(info.normalize, "username");
      assert.equal(info.filter_complete, true);
      assert.equal(info.error_rate, 0.001);
      assert.equal(info.cache_ttl, 300);
      assert.equal(typeof info.filter_items, "number");
      assert.ok(info.filter_items >= 106, `${info.filter_items}`);
      assert.equal(typeof info.bloom_exists_true_rate, "number");

      await sets.alter(name, { cacheTtl: 60 });
      await sets.alter(name, { capacity: 20000, sync: true });
      const altered = await sets.info(name);
      assert.equal(altered.cache_ttl, 60);
      assert.equal(altered.capacity, 20000);
      assert.equal(await sets.rebuild(name), null);
      await waitIdle(sets, name);
      assert.equal(await sets.rebuild(name, { sync: true }), 106);
      assert.equal(await sets.exists(name, "alice"), true);
      await sets.drop(name, { deleteData: true });
      await assert.rejects(sets.exists(name, "alice"), NoSuchSet);
    } finally {
      await close();
    }
  });

  if (lib.startsWith("redis")) {
    test(`${lib}: replies under RESP3 (maps as objects)`, async () => {
      const { client, close } = await connect({ ...server, resp3: true });
      try {
        const sets = new Sets(client);
        const name = `${lib}_resp3`;
        await sets.create(name, { cacheTtl: 300 });
        assert.equal(await sets.add(name, "alice"), true);
        assert.deepEqual(await sets.mexists(name, ["alice", "bob"]), [true, false]);
        assert.deepEqual(await sets.explain(name, "bob"), { member: false, path: "bloom-negative" });
        const info = await sets.info(name);
        assert.equal(info.name, name);
        assert.equal(info.cache_ttl, 300);
        assert.equal(info.filter_complete, true);
        assert.equal(info.filter_items, 1);
        assert.equal(await sets.rebuild(name, { sync: true }), 1);
      } finally {
        await close();
      }
    });
  }

  test(`${lib}: NoSuchSet, and other errors as the library gives them`, async () => {
    const { client, close } = await connect(server);
    try {
      const sets = new Sets(client);
      for (const call of [
        () => sets.exists("nosuch", "x"),
        () => sets.add("nosuch", "x"),
        () => sets.del("nosuch", "x"),
        () => sets.explain("nosuch", "x"),
        () => sets.mexists("nosuch", ["x"]),
        () => sets.madd("nosuch", ["x"]),
        () => sets.info("nosuch"),
        () => sets.rebuild("nosuch"),
        () => sets.alter("nosuch", { cacheTtl: 5 }),
        () => sets.drop("nosuch"),
      ]) {
        await assert.rejects(call(), (e) => {
          assert.ok(e instanceof NoSuchSet, `${e}`);
          assert.equal(e.message, "ERR no such set: create it with MEMBER.CREATE");
          assert.equal(e.retryable, false);
          assert.ok(e.cause instanceof Error);
          return true;
        });
      }
      for (const [call, text] of [
        [() => sets.create(`${lib}_bad`, { error: 2 }), "ERROR must be a number"],
        [() => sets.exists("Not-A-Name", "x"), "invalid set name"],
      ]) {
        await assert.rejects(call(), (e) => {
          assert.ok(e.message.includes(text), e.message);
          return !(e instanceof MemberError);
        });
      }
    } finally {
      await close();
    }
  });

  test(`${lib}: NoPermission from the module and from the server`, async () => {
    const { client, close } = await connect(server);
    const conn = admin(server);
    try {
      const sets = new Sets(client);
      const name = `${lib}_cards`;
      await sets.create(name);
      assert.equal(await sets.add(name, "4111"), true);
      // May read member:<set>, not write it.
      await conn.call("ACL", "SETUSER", `${lib}_reader`, "on", ">pw", "+@all", `%R~member:${name}`);
      await conn.call("ACL", "SETUSER", `${lib}_pinger`, "on", ">pw", "+@all", "-member.exists", "~*");
      const reader = await connect({ ...server, username: `${lib}_reader`, password: "pw" });
      const pinger = await connect({ ...server, username: `${lib}_pinger`, password: "pw" }).catch(async (e) => {
        await reader.close();
        throw e;
      });
      try {
        const asReader = new Sets(reader.client);
        assert.equal(await asReader.exists(name, "4111"), true);
        for (const call of [() => asReader.add(name, "5500"), () => asReader.madd(name, ["5500"])]) {
          await assert.rejects(call(), (e) => {
            assert.ok(e instanceof NoPermission, `${e}`);
            assert.ok(e.message.startsWith(`NOPERM this user may not write set '${name}'`), e.message);
            return true;
          });
        }
        assert.equal(await sets.exists(name, "5500"), false);
        await assert.rejects(new Sets(pinger.client).exists(name, "4111"), (e) => {
          assert.ok(e instanceof NoPermission, `${e}`);
          assert.ok(e.message.includes("no permissions to run"), e.message);
          return true;
        });
      } finally {
        await reader.close();
        await pinger.close();
      }
    } finally {
      conn.disconnect();
      await close();
    }
  });
}

/** Waits until no rebuild of `name` runs. */
async function waitIdle(sets, name) {
  const deadline = Date.now() + 30000;
  while ((await sets.info(name)).rebuild_state !== "idle") {
    assert.ok(Date.now() < deadline, "the rebuild never ended");
    await new Promise((r) => setTimeout(r, 50));
  }
}
