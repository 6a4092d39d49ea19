// Compiled (never run) by types.test.js with `tsc --noEmit --strict`: index.d.ts accepts every
// supported library's clients as they are typed by the library itself, and its results have
// the types the README promises.
import IORedis5, { Cluster as IOCluster5 } from "ioredis5";
import IORedis6, { Cluster as IOCluster6 } from "ioredis6";
import Valkey, { Cluster as ValkeyCluster } from "iovalkey";
import { createClient as createClient5, createCluster as createCluster5 } from "redis5";
import { createClient as createClient6, createCluster as createCluster6 } from "redis6";
import { GlideClient, GlideClusterClient } from "@valkey/valkey-glide";
import { Sets, Unavailable, NoSuchSet, NoPermission, MemberError, keyslot, Explanation, Info } from "..";

declare const glide: GlideClient;
declare const glideCluster: GlideClusterClient;

const clients = [
  new Sets(new IORedis5()),
  new Sets(new IOCluster5([])),
  new Sets(new IORedis6()),
  new Sets(new IOCluster6([])),
  new Sets(new Valkey()),
  new Sets(new ValkeyCluster([])),
  new Sets(createClient5()),
  new Sets(createCluster5({ rootNodes: [] })),
  new Sets(createClient6()),
  new Sets(createCluster6({ rootNodes: [] })),
  new Sets(glide),
  new Sets(glideCluster),
];

async function typed(sets: Sets): Promise<void> {
  await sets.create("users", { normalize: "username", capacity: 1000, cacheTtl: 300 });
  await sets.alter("users", { cacheTtl: 60, sync: true });
  const added: boolean = await sets.add("users", "alice", { scope: "m", ttl: 5 });
  const found: boolean = await sets.exists("users", Buffer.from("alice"));
  const removed: boolean = await sets.del("users", "alice");
  const why: Explanation = await sets.explain("users", "alice");
  const member: boolean = why.member;
  const many: boolean[] = await sets.mexists("users", ["a", "b"], { scope: "m" });
  const more: boolean[] = await sets.madd("users", ["a"], { expireat: 2000000000 });
  const info: Info = await sets.info("users");
  const nodes: Info[] | undefined = info.nodes;
  const started: null = await sets.rebuild("users");
  const loaded: number = await sets.rebuild("users", { sync: true });
  await sets.drop("users", { deleteData: true });
  const slot: number = keyslot("alice");
  void [added, found, removed, member, many, more, nodes, started, loaded, slot];
}

function errors(e: unknown): string {
  if (e instanceof Unavailable) return e.retryable ? e.reply : "";
  if (e instanceof NoSuchSet || e instanceof NoPermission) return e.message;
  if (e instanceof MemberError) return String(e.cause);
  return "";
}

void [clients, typed, errors];
