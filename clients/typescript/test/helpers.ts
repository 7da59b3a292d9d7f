/**
 * The real host for the client's tests: `python -m host serve` on a data dir under the
 * system's temp folder, with every message that crosses the pipes checked against
 * docs/protocol.schema.json (so the schema is proven against what the host really sends).
 *
 * `HOSTCORE_PYTHON` names the Python that has hostcore installed (the Makefile passes the
 * worktree's `.venv/bin/python`).
 */

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import Ajv2020Module, { type ValidateFunction } from "ajv/dist/2020.js";

import {
  HostClient,
  type ClientOptions,
  type Message,
  type Role,
  type TraceEvent,
} from "../src/index.js";

export const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));
export const REPO = join(PACKAGE, "..", "..");
export const SCHEMA_FILE = join(REPO, "docs", "protocol.schema.json");

function python(): string {
  const given = process.env["HOSTCORE_PYTHON"];
  if (given) return given;
  const venv = join(REPO, ".venv", "bin", "python");
  if (existsSync(venv)) return venv;
  throw new Error("set HOSTCORE_PYTHON to a Python with hostcore installed (make test does)");
}

// ajv's CommonJS default export, seen from an ES module.
const Ajv2020 = Ajv2020Module as unknown as typeof Ajv2020Module.default;

/** Validators for the wire, compiled once from the schema file. */
export class WireSchema {
  readonly #ajv: InstanceType<typeof Ajv2020>;
  readonly #cache = new Map<string, ValidateFunction>();

  private constructor(schema: object) {
    this.#ajv = new Ajv2020({ strict: true, allowUnionTypes: true, allErrors: true });
    this.#ajv.addSchema(schema, "hostcore");
  }

  static async load(): Promise<WireSchema> {
    return new WireSchema(JSON.parse(await readFile(SCHEMA_FILE, "utf8")) as object);
  }

  /** The errors of `value` against the definition at `pointer` (empty when it is valid). */
  check(pointer: string, value: unknown): string[] {
    let validate = this.#cache.get(pointer);
    if (!validate) {
      validate = this.#ajv.getSchema(`hostcore#${pointer}`);
      if (!validate) throw new Error(`no schema at ${pointer}`);
      this.#cache.set(pointer, validate);
    }
    if (validate(value)) return [];
    return (validate.errors ?? []).map((e) => `${e.instancePath || "/"} ${e.message ?? ""}`);
  }
}

const schemaPromise = WireSchema.load();
const live = new Set<TestHost>();

/**
 * Kill every host a test started and did not stop, and remove its data dir: run after each
 * test (`afterEach(stopAll)`), so a failed test leaves no process behind to keep Node alive.
 */
export async function stopAll(): Promise<void> {
  for (const host of live) {
    host.client.kill();
    await host.client.gone;
    await removeDir(host.dataDir);
  }
  live.clear();
}

/** Close a host the way an app quits (end of input), check it exited 0 and spoke the schema. */
export async function finish(host: TestHost): Promise<void> {
  const gone = await host.client.close();
  live.delete(host);
  assert.equal(gone.exitCode, 0, host.log());
  assert.deepEqual(host.violations, [], "messages that do not match the schema");
  await removeDir(host.dataDir);
}

function methodPointer(method: string, part: "params" | "result"): string {
  return `/$defs/Methods/properties/${method.replace(/~/g, "~0").replace(/\//g, "~1")}/properties/${part}`;
}

/** A host under test: its client, its data dir, its log, what did not match the schema. */
export interface TestHost {
  client: HostClient;
  dataDir: string;
  log: () => string;
  /** Every message that did not match the schema, with the reason. */
  violations: string[];
}

/**
 * Spawn a host on `dataDir` (a new temp dir when not given). Every request sent and every
 * answer received is validated; `violations` lists what did not match.
 */
export async function startHost(
  dataDir?: string,
  options: ClientOptions & { args?: string[] } = {},
): Promise<TestHost> {
  const schema = await schemaPromise;
  const dir = dataDir ?? (await mkdtemp(join(tmpdir(), "hostcore-ts-")));
  const violations: string[] = [];
  let log = "";
  const check = (event: TraceEvent): void => {
    const problems: string[] = [];
    if (event.direction === "send") {
      const m = event.message;
      problems.push(...schema.check("id" in m ? "/$defs/Request" : "/$defs/CancelNotification", m));
    } else {
      const m = event.message;
      problems.push(...schema.check("/$defs/Response", m));
      if ("result" in m && event.method) {
        problems.push(...schema.check(methodPointer(event.method, "result"), m.result));
      }
    }
    if (problems.length) {
      violations.push(
        `${event.direction} ${JSON.stringify(event.message).slice(0, 300)}: ${problems.join("; ")}`,
      );
    }
    options.trace?.(event);
  };
  const client = HostClient.spawn({
    ...options,
    dataDir: dir,
    python: python(),
    ...(options.args ? { args: options.args } : {}),
    onStderr: (chunk) => {
      log += chunk.toString("utf8");
    },
    trace: check,
  });
  const host = { client, dataDir: dir, log: () => log, violations };
  live.add(host);
  return host;
}

/** Remove a test's data dir. */
export async function removeDir(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
}

/** A message object as an app sends it. */
export function message(id: string, role: Role, content: Message["content"]): Message {
  return { id, role, content };
}

/** A promise and the function that settles it, for waiting on an event without a sleep. */
export function signal<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}
