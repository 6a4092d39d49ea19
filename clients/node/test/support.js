// What the package's tests share: the servers from the environment (tests/all/node_client.rs
// starts them), one connect() per client library, and MOVED counted on every node of a
// cluster. A test whose server is not given fails: nothing is skipped in silence.
"use strict";

const assert = require("node:assert/strict");

/** The value of `name`, or a failure saying how these tests are meant to be run. */
function need(name) {
  const value = process.env[name];
  if (!value) {
    assert.fail(`${name} is not set: run these tests through \`cargo test --test all node_client::\`, which starts the servers`);
  }
  return value;
}

/** host and port of "host:port" or "redis://host:port[/db]". */
function address(given) {
  const text = given.replace(/^redis:\/\//, "").replace(/\/.*$/, "");
  const at = text.lastIndexOf(":");
  return { host: text.slice(0, at), port: Number(text.slice(at + 1)) };
}

/** Every client library the package supports, by the name MEMBER_CLIENTS uses. Each opens a
 * standalone or a cluster client from one node's address (and optional user), connected,
 * with `close()`; node-redis speaks RESP3 when asked (`resp3`; GLIDE always does), ioredis
 * and iovalkey auto-pipeline when asked (`autoPipelining`). */
const LIBRARIES = {
  ioredis5: ioredisLike(() => require("ioredis5")),
  ioredis6: ioredisLike(() => require("ioredis6")),
  iovalkey: ioredisLike(() => require("iovalkey")),
  redis5: nodeRedis(() => require("redis5")),
  redis6: nodeRedis(() => require("redis6")),
  glide: glide(),
};

function ioredisLike(load) {
  return async ({ host, port, cluster, username, password, autoPipelining = false }) => {
    const Redis = load();
    const enableAutoPipelining = autoPipelining;
    const client = cluster
      ? new Redis.Cluster([{ host, port }], { redisOptions: { username, password }, enableAutoPipelining })
      : new Redis({ host, port, username, password, enableAutoPipelining });
    return { client, close: async () => client.disconnect() };
  };
}

function nodeRedis(load) {
  return async ({ host, port, cluster, username, password, resp3 }) => {
    const redis = load();
    const RESP = resp3 ? 3 : 2;
    const client = cluster
      ? redis.createCluster({ rootNodes: [{ socket: { host, port } }], defaults: { username, password }, RESP })
      : redis.createClient({ socket: { host, port }, username, password, RESP });
    client.on("error", () => {});
    await client.connect();
    return { client, close: async () => (client.close ? client.close() : client.quit()) };
  };
}

function glide() {
  return async ({ host, port, cluster, username, password }) => {
    const { GlideClient, GlideClusterClient, Logger } = require("@valkey/valkey-glide");
    Logger.setLoggerConfig("off");
    const config = { addresses: [{ host, port }], requestTimeout: 30000 };
    if (username) config.credentials = { username, password };
    const client = await (cluster ? GlideClusterClient : GlideClient).createClient(config);
    return { client, close: async () => client.close() };
  };
}

/** The libraries MEMBER_CLIENTS names (comma-separated), each checked to be one we know. */
function libraries() {
  return need("MEMBER_CLIENTS")
    .split(",")
    .map((name) => {
      assert.ok(LIBRARIES[name], `unknown client library ${name}: one of ${Object.keys(LIBRARIES)}`);
      return [name, LIBRARIES[name]];
    });
}

/** A plain ioredis connection to one node, for what the tests check beside the package. */
function admin({ host, port }) {
  const Redis = require("ioredis5");
  return new Redis({ host, port });
}

/** The MOVED errors every node of the cluster has answered so far (`INFO errorstats`). */
async function movedCount(nodes) {
  let total = 0;
  for (const node of nodes) {
    const conn = admin(node);
    try {
      const info = await conn.info("errorstats");
      const m = /errorstat_MOVED:count=(\d+)/.exec(info);
      total += m ? Number(m[1]) : 0;
    } finally {
      conn.disconnect();
    }
  }
  return total;
}

/** Polls `check` (async, truthy when done) every 50 ms until `timeoutMs`; fails with `what`. */
async function eventually(what, check, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const last = await check();
    if (last) return last;
    assert.ok(Date.now() < deadline, `${what}: not within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

module.exports = { need, address, libraries, admin, movedCount, eventually, LIBRARIES };
