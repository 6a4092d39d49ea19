// libmember from ioredis on one server: node standalone.js [redis://127.0.0.1:6380] [set]
// (`make run` serves 6380). Prints each answer; exits 75 (try again later) when PostgreSQL
// stays unavailable.
const Redis = require("ioredis");
const { isUnavailable, retrying } = require("./unavailable");

async function main(url = "redis://127.0.0.1:6380", set = "users") {
  const redis = new Redis(url);
  try {
    // Module commands go through call(); the replies are plain integers and arrays.
    await retrying(() => redis.call("MEMBER.CREATE", set, "NORMALIZE", "username"));
    const added = await retrying(() => redis.call("MEMBER.ADD", set, "alice")); // 1, or 0 if already
    const taken = await retrying(() => redis.call("MEMBER.EXISTS", set, "ALICE")); // 1: one member
    const free = await retrying(() => redis.call("MEMBER.EXISTS", set, "bob")); // 0
    const both = await retrying(() => redis.call("MEMBER.MEXISTS", set, "ITEMS", "alice", "bob")); // [1, 0]
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
