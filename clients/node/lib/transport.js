// One way per client library to send a command to the node that serves its routing argument:
// ioredis 5 and 6 and iovalkey (Redis, Cluster), node-redis 5 and 6 (client, cluster), and
// GLIDE (GlideClient, GlideClusterClient). Each sends at once, so concurrent calls share each
// node's connection (pipelined), and each lets its library follow a redirection itself.
"use strict";

const { keyslot, keyForSlot } = require("./slot");

/** GLIDE's `Decoder.String`: replies as strings. */
const GLIDE_STRING = 1;

function constructorNames(object) {
  const names = [];
  for (let p = Object.getPrototypeOf(object); p && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
    if (p.constructor && p.constructor.name) names.push(p.constructor.name);
  }
  return names;
}

/** ioredis and iovalkey: `call()`, which both classes have. In a cluster, the command goes
 * through the library's own `sendCommand` (slot map, MOVED/ASK/TRYAGAIN handling, offline
 * queue) with its slot set to the routing argument's: the library knows no key position for
 * a module command and would otherwise pick a random node. Auto-pipelining is left out for
 * these calls, as it groups a cluster's commands by their first argument. */
function ioredis(client) {
  if (!client.isCluster) {
    return { kind: "ioredis", cluster: false, send: ({ args }) => client.call(...args) };
  }
  const options = { ...client.options, enableAutoPipelining: false };
  return {
    kind: "ioredis",
    cluster: true,
    send({ args, key }) {
      const slot = keyslot(key);
      const via = Object.create(client, {
        options: { value: options },
        sendCommand: {
          value(cmd, ...rest) {
            cmd.slot = slot;
            return client.sendCommand(cmd, ...rest);
          },
        },
      });
      return client.call.apply(via, args);
    },
  };
}

/** node-redis: `sendCommand(args)` on a client; on a cluster `sendCommand(firstKey,
 * isReadonly, args)`, the routing argument as the key (the library takes its slot the
 * server's way) and never read-only, so the call goes to the slot's primary. */
function nodeRedis(client, cluster) {
  if (!cluster) return { kind: "node-redis", cluster: false, send: ({ args }) => client.sendCommand(args) };
  return { kind: "node-redis", cluster: true, send: ({ args, key }) => client.sendCommand(key, false, args) };
}

/** GLIDE: `customCommand(args)`; on a GlideClusterClient routed to the primary of the
 * routing argument's slot (`primarySlotKey`). That route takes a text key only, so bytes are
 * routed by a text key of the same slot. (Not `primarySlotId`: GLIDE 2.5 sends that route in
 * the slot-key field of its request, and the call goes to the owner of slot 0.) */
function glide(client, cluster) {
  if (!cluster) {
    return { kind: "glide", cluster: false, send: ({ args }) => client.customCommand(args, { decoder: GLIDE_STRING }) };
  }
  return {
    kind: "glide",
    cluster: true,
    send: ({ args, key }) =>
      client.customCommand(args, {
        route: { type: "primarySlotKey", key: typeof key === "string" ? key : keyForSlot(keyslot(key)) },
        decoder: GLIDE_STRING,
      }),
  };
}

/** The transport for `client`, recognized by its shape (no client library is loaded here). */
function transportFor(client) {
  if (client === null || typeof client !== "object") throw new TypeError(usage());
  if (typeof client.call === "function" && typeof client.sendCommand === "function" && "isCluster" in client) {
    return ioredis(client);
  }
  if (typeof client.customCommand === "function") {
    return glide(client, constructorNames(client).includes("GlideClusterClient"));
  }
  if (typeof client.sendCommand === "function") {
    return nodeRedis(client, typeof client.getSlotRandomNode === "function");
  }
  throw new TypeError(usage());
}

function usage() {
  return (
    "libmember: Sets needs a client of ioredis or iovalkey (Redis, Cluster), node-redis " +
    "(createClient, createCluster) or @valkey/valkey-glide (GlideClient, GlideClusterClient)"
  );
}

module.exports = { transportFor };
