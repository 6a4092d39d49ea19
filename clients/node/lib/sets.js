// `Sets`: the MEMBER.* commands over any supported client, each sent to the node of its
// routing argument, replies typed, error replies raised as typed errors. Every answer is the
// server's: no filter, no cache, no retry here.
"use strict";

const cmd = require("./commands");
const { mapError } = require("./errors");
const { transportFor } = require("./transport");

class Sets {
  /** `client`: an ioredis or iovalkey `Redis` or `Cluster`, a node-redis client or cluster,
   * or a GLIDE `GlideClient` or `GlideClusterClient`, connected or connecting. */
  constructor(client) {
    this.client = client;
    this._transport = transportFor(client);
  }

  /** Which kind of client this is (`ioredis`, `node-redis`, `glide`) and whether it is a
   * cluster client. */
  get transport() {
    return { kind: this._transport.kind, cluster: this._transport.cluster };
  }

  async _run(command) {
    try {
      return await this._transport.send(command);
    } catch (err) {
      throw mapError(err);
    }
  }

  async create(name, settings = {}) {
    cmd.isOk(await this._run(cmd.create(name, settings)));
  }

  async alter(name, settings = {}) {
    cmd.isOk(await this._run(cmd.alter(name, settings)));
  }

  async drop(name, options = {}) {
    cmd.isOk(await this._run(cmd.drop(name, options)));
  }

  async add(name, item, options = {}) {
    return cmd.flag(await this._run(cmd.add(name, item, options)));
  }

  async exists(name, item, options = {}) {
    return cmd.flag(await this._run(cmd.item("MEMBER.EXISTS", name, item, options)));
  }

  async del(name, item, options = {}) {
    return cmd.flag(await this._run(cmd.item("MEMBER.DEL", name, item, options)));
  }

  async explain(name, item, options = {}) {
    return cmd.explanation(await this._run(cmd.item("MEMBER.EXPLAIN", name, item, options)));
  }

  async mexists(name, items, options = {}) {
    if (items.length === 0) return [];
    return cmd.flags(await this._run(cmd.mexists(name, items, options)));
  }

  async madd(name, items, options = {}) {
    if (items.length === 0) return [];
    return cmd.flags(await this._run(cmd.madd(name, items, options)));
  }

  async info(name) {
    return cmd.infoObject(await this._run(cmd.info(name)));
  }

  async rebuild(name, options = {}) {
    const reply = await this._run(cmd.rebuild(name, options));
    if (options.sync) return Number(cmd.text(reply));
    cmd.isOk(reply);
    return null;
  }
}

module.exports = { Sets };
