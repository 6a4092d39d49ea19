// libmember for Node.js: the MEMBER.* commands of the libmember Valkey module over ioredis,
// iovalkey, node-redis or GLIDE, each call sent to its node, replies and errors typed.
"use strict";

const { Sets } = require("./lib/sets");
const { MemberError, Unavailable, NoSuchSet, NoPermission } = require("./lib/errors");
const { keyslot } = require("./lib/slot");
const { ROUTING } = require("./lib/commands");

module.exports = { Sets, MemberError, Unavailable, NoSuchSet, NoPermission, keyslot, ROUTING };
