// index.d.ts against every supported library's own types: test/types.ts compiles under
// `tsc --strict` (TypeScript pinned in devDependencies).
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { spawnSync } = require("node:child_process");
const path = require("node:path");

test("index.d.ts types every supported client and every result", () => {
  const tsc = path.join(__dirname, "..", "node_modules", "typescript", "bin", "tsc");
  const run = spawnSync(process.execPath, [tsc, "--noEmit", "--strict", "--esModuleInterop", "--skipLibCheck",
    "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", path.join(__dirname, "types.ts")], { encoding: "utf8" });
  assert.equal(run.status, 0, `tsc:\n${run.stdout}${run.stderr}`);
});
