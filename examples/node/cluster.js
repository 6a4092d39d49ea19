// libmember from ioredis on a Valkey Cluster: node cluster.js [127.0.0.1:7001] [set]
// (`make cluster` serves 7001-7006). Prints each answer.
//
// ioredis knows no key positions for module commands (its table is built in): alone, it would
// send each call to a random primary and follow the server's MOVED. Through the libmember
// package each call goes straight to the primary of its routing argument's slot: the item for
// add, exists, del and explain, the set name for the others. Concurrent calls share each
// node's connection (pipelined), with no MOVED.
const Redis = require("ioredis");
const { Sets } = require("libmember");
const { retrying } = require("./unavailable");

async function main(node = "127.0.0.1:7001", set = "users") {
  const [host, port] = node.split(":");
  const cluster = new Redis.Cluster([{ host, port: Number(port) }]);
  const sets = new Sets(cluster);
  try {
    // Set-wide: CREATE goes to the owner of the set name's slot.
    await retrying(() => sets.create(set, { normalize: "username" }));
    // Many items, one call: the set name's node asks the owners of the items' slots.
    const names = ["alice", "bob", "carol"];
    const added = await retrying(() => sets.madd(set, names));
    // One item, one call, routed by its item; the three go out together.
    const asked = ["ALICE", "Bob", "dave"];
    const found = await Promise.all(asked.map((n) => retrying(() => sets.exists(set, n))));
    // info(), routed by the set name like create(), reports the set over every node: totals,
    // then `nodes`, each node's own fields. (rebuild(), routed the same way, has every primary
    // rebuild.)
    const info = await retrying(() => sets.info(set));
    const primaries = info.nodes.filter((n) => n.role === "primary");
    console.log(`added ${names.join(" ")}: ${JSON.stringify(added)}`);
    console.log(`exists ${asked.join(" ")}: ${JSON.stringify(found)}`);
    console.log(`slots owned by the ${primaries.length} primaries: ${info.cluster_slots_owned}`);
  } finally {
    cluster.disconnect();
  }
}

main(...process.argv.slice(2)).catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
