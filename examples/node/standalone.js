// libmember from ioredis on one server: node standalone.js [redis://127.0.0.1:6380] [set]
// (`make run` serves 6380). Prints each answer; exits 75 (try again later) when PostgreSQL
// stays unavailable.
const Redis = require("ioredis");
const { Sets } = require("libmember");
const { isUnavailable, retrying } = require("./unavailable");

async function main(url = "redis://127.0.0.1:6380", set = "users") {
  const redis = new Redis(url);
  const sets = new Sets(redis);
  try {
    // The libmember package sends MEMBER.* and gives typed answers: booleans, arrays of them.
    await retrying(() => sets.create(set, { normalize: "username" }));
    const added = await retrying(() => sets.add(set, "alice")); // true, or false if already
    const taken = await retrying(() => sets.exists(set, "ALICE")); // true: one member
    const free = await retrying(() => sets.exists(set, "bob")); // false
    const both = await retrying(() => sets.mexists(set, ["alice", "bob"])); // [true, false]
    console.log(`added alice: ${added}`);
    console.log(`exists ALICE: ${taken}`);
    console.log(`exists bob: ${free}`);
    console.log(`mexists alice bob: ${JSON.stringify(both)}`);
  } catch (err) {
    if (!isUnavailable(err)) throw err;
    console.error(`unavailable, try again later: ${err.message}`);
    process.exitCode = 75;
  } finally {
    redis.disconnect();
  }
}

main(...process.argv.slice(2)).catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
