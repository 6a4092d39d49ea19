// libmember from ioredis on a Valkey Cluster: node cluster.js [127.0.0.1:7001] [set]
// (`make cluster` serves 7001-7006). Prints each answer.
//
// ioredis knows no key positions for module commands (its table is built in), so it sends
// each single call to a random primary and follows the MOVED that the server answers for a
// node that does not own the routing argument: the item for ADD, EXISTS, DEL and EXPLAIN,
// the set name for CREATE, ALTER, DROP, REBUILD, INFO, MEXISTS and MADD. Do not pipeline them through
// the cluster client: a pipeline's MOVED errors reach the application
// (docs/cluster-commands.md).
const Redis = require("ioredis");
const { retrying } = require("./unavailable");

async function main(node = "127.0.0.1:7001", set = "users") {
  const [host, port] = node.split(":");
  const cluster = new Redis.Cluster([{ host, port: Number(port) }]);
  try {
    // Set-wide: CREATE lands on the owner of the set name's slot through one MOVED.
    await retrying(() => cluster.call("MEMBER.CREATE", set, "NORMALIZE", "username"));
    // Many items, one call: the set name's node asks the owners of the items' slots.
    const names = ["alice", "bob", "carol"];
    const added = await retrying(() => cluster.call("MEMBER.MADD", set, "ITEMS", ...names));
    // One item, one call, routed by its item.
    const asked = ["ALICE", "Bob", "dave"];
    const found = await Promise.all(asked.map((n) => retrying(() => cluster.call("MEMBER.EXISTS", set, n))));
    // MEMBER.INFO, routed by the set name like CREATE, reports the set over every node: totals,
    // then `nodes`, each node's own fields. (REBUILD, routed the same way, has every primary
    // rebuild.)
    const info = await retrying(() => cluster.call("MEMBER.INFO", set));
    const field = (fields, name) => fields[fields.indexOf(name) + 1];
    const primaries = field(info, "nodes").filter((n) => field(n, "role") === "primary");
    console.log(`added ${names.join(" ")}: ${JSON.stringify(added)}`);
    console.log(`exists ${asked.join(" ")}: ${JSON.stringify(found)}`);
    console.log(`slots owned by the ${primaries.length} primaries: ${field(info, "cluster_slots_owned")}`);
  } finally {
    cluster.disconnect();
  }
}

main(...process.argv.slice(2)).catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
