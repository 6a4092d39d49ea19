// Unavailable while PostgreSQL is stopped, over each library's standalone client
// (MEMBER_CLIENTS). tests/all/node_client.rs made the set `down` with alice and bob, never
// looked up, so each lookup needs the database, then stopped it.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { Sets, Unavailable, MemberError } = require("..");
const { need, address, libraries } = require("./support");

const server = address(need("MEMBER_URL"));

for (const [lib, connect] of libraries()) {
  test(`${lib}: Unavailable, retryable, with the server's text`, async () => {
    const { client, close } = await connect(server);
    try {
      const sets = new Sets(client);
      for (const call of [
        () => sets.exists("down", "alice"),
        () => sets.mexists("down", ["bob"]),
        () => sets.add("down", `carol-${lib}`),
        () => sets.madd("down", [`dave-${lib}`]),
      ]) {
        await assert.rejects(call(), (e) => {
          assert.ok(e instanceof Unavailable, `${e}`);
          assert.ok(e instanceof MemberError && e instanceof Error);
          assert.ok(e.message.startsWith("UNAVAILABLE "), e.message);
          assert.equal(e.retryable, true);
          return true;
        });
      }
    } finally {
      await close();
    }
  });
}
