/**
 * docs/protocol.schema.json read by the standard generators as an integrator runs them:
 * `json-schema-to-typescript` with no options and `quicktype -s schema ... -l ts`. Their
 * output, the client's `call`, and the usage files in test/types/ are compiled with
 * `tsc --strict`: what an app writes must compile, and each line marked
 * `// error TSnnnn` must fail with exactly that error (and nothing else may fail).
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { copyFile, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

import { PACKAGE, SCHEMA_FILE, WireSchema } from "./helpers.js";

const run = promisify(execFile);
const BIN = join(PACKAGE, "node_modules", ".bin");
const FIXTURES = join(PACKAGE, "test", "types");
const USAGE = ["jstt-usage.ts", "quicktype-usage.ts", "client-usage.ts"];

async function generate(tool: string, args: string[]): Promise<string> {
  const { stdout } = await run(join(BIN, tool), args, { maxBuffer: 64 << 20 });
  return stdout;
}

/** The part of Electron's API the README's example uses, as Electron declares it. */
const ELECTRON = `
declare module "electron" {
  interface Event { preventDefault(): void }
  export const app: {
    readonly isPackaged: boolean;
    getPath(name: "userData" | "appData" | "temp"): string;
    on(event: "before-quit", listener: (event: Event) => void): void;
    exit(exitCode?: number): void;
    whenReady(): Promise<void>;
  };
}
declare namespace NodeJS { interface Process { readonly resourcesPath: string } }
`;

/** The TypeScript block of README.md that follows the marker saying it is compiled here. */
async function readmeExample(): Promise<string> {
  const readme = await readFile(join(PACKAGE, "README.md"), "utf8");
  const marker = readme.indexOf("<!-- The block below is compiled by test/schema.test.ts");
  const block = /```ts\n([\s\S]*?)```/.exec(readme.slice(marker));
  assert.ok(marker >= 0 && block?.[1], "README.md: the Electron example block is missing");
  return block[1];
}

/** `file:line:code` of every line marked `// error TSnnnn` in the usage files. */
async function expectedErrors(): Promise<string[]> {
  const out: string[] = [];
  for (const file of USAGE) {
    const lines = (await readFile(join(FIXTURES, file), "utf8")).split("\n");
    lines.forEach((line, i) => {
      const mark = /\/\/ error (TS\d+)\s*$/.exec(line);
      if (mark) out.push(`${file}:${i + 1}:${mark[1]}`);
    });
  }
  return out.sort();
}

test(
  "json-schema-to-typescript and quicktype output compiles under tsc --strict and refuses what it should",
  { timeout: 120_000 },
  async () => {
    const dir = await mkdtemp(join(PACKAGE, ".check-"));
    try {
      const [jstt, quicktype] = await Promise.all([
        generate("json2ts", [SCHEMA_FILE]), // no options
        generate("quicktype", ["-s", "schema", SCHEMA_FILE, "-l", "ts"]),
      ]);
      assert.match(jstt, /export interface HostcoreProtocol \{/);
      assert.match(jstt, /export interface Methods \{/);
      assert.doesNotMatch(
        jstt,
        /export interface HostcoreProtocol \{\s*\[k: string\]: unknown;\s*\}/,
      );
      assert.match(quicktype, /export interface Methods \{/);
      await writeFile(join(dir, "jstt.ts"), jstt);
      await writeFile(join(dir, "quicktype.ts"), quicktype);
      for (const file of USAGE) await copyFile(join(FIXTURES, file), join(dir, file));
    await writeFile(join(dir, "readme-example.ts"), await readmeExample());
    await writeFile(join(dir, "electron.d.ts"), ELECTRON);
      const config = {
        compilerOptions: {
          strict: true,
          noEmit: true,
          target: "ES2022",
          lib: ["ES2023"],
          module: "NodeNext",
          moduleResolution: "NodeNext",
          types: ["node"],
        },
        // client-usage.ts imports ../src/; the README's example imports the package by name
      files: ["jstt.ts", "quicktype.ts", ...USAGE, "readme-example.ts", "electron.d.ts"],
      };
      await writeFile(join(dir, "tsconfig.json"), JSON.stringify(config));
      const result = await run(join(BIN, "tsc"), ["-p", dir, "--pretty", "false"], {
        maxBuffer: 16 << 20,
      }).then(
        ({ stdout }) => stdout,
        (e: { stdout?: string }) => e.stdout ?? String(e),
      );
      const diagnostics = result.split("\n").filter((line) => /: error TS\d+:/.test(line));
      const got = diagnostics
        .map((line) => /^(?:.*\/)?([^/(]+)\((\d+),\d+\): error (TS\d+):/.exec(line))
        .map((m, i) => (m ? `${m[1]}:${m[2]}:${m[3]}` : `unparsed: ${diagnostics[i]}`))
        .sort();
      assert.deepEqual(got, await expectedErrors(), result);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },
);

test("the wire checker the host tests use refuses what the schema refuses", async () => {
  const schema = await WireSchema.load();
  const result = "/$defs/Methods/properties/session.appendMessage/properties/result";
  assert.deepEqual(schema.check(result, { line: 0, appended: true }), []);
  assert.notDeepEqual(schema.check(result, { line: 0, appended: true, extra: 1 }), []);
  assert.notDeepEqual(schema.check(result, { line: -1, appended: true }), []);
  const request = { jsonrpc: "2.0", id: 1, method: "session.appendMessage" };
  const message = { id: "m", role: "user", content: "hi", anything: [1] };
  assert.deepEqual(
    schema.check("/$defs/Request", { ...request, params: { sessionId: "s", message } }),
    [],
  );
  assert.notDeepEqual(
    schema.check("/$defs/Request", { ...request, params: { sessionId: "s", message: 42 } }),
    [],
  );
  assert.notDeepEqual(
    schema.check("/$defs/Request", { ...request, params: { sessionId: "../x", message } }),
    [],
  );
  const error = {
    code: -32004,
    message: "session 's' not found",
    data: { code: "NOT_FOUND", kind: "session" },
  };
  assert.deepEqual(schema.check("/$defs/Response", { jsonrpc: "2.0", id: 3, error }), []);
  const wrong = { ...error, data: { code: "NOT_FOUND", kind: "file" } };
  assert.notDeepEqual(schema.check("/$defs/Response", { jsonrpc: "2.0", id: 3, error: wrong }), []);
  const list = "/$defs/Methods/properties/session.list/properties/params";
  assert.deepEqual(schema.check(list, {}), []);
  assert.notDeepEqual(schema.check(list, { sessionId: "s" }), []);
});
