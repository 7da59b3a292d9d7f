// Generate src/protocol.ts from docs/protocol.schema.json (run by `npm run build`).
//
// The types are json-schema-to-typescript's output with its default options, exactly what an
// integrator gets from `npx json-schema-to-typescript docs/protocol.schema.json`; the constants
// below them are read from the same schema's root.
import { readFile, writeFile } from "node:fs/promises";
import { compile } from "json-schema-to-typescript";

const here = new URL("..", import.meta.url);
const source = new URL("../../docs/protocol.schema.json", here);
const target = new URL("src/protocol.ts", here);

const schema = JSON.parse(await readFile(source, "utf8"));
const banner = `/* Generated from docs/protocol.schema.json by scripts/gen-types.mjs: do not edit. */`;
const types = await compile(schema, schema.title, { bannerComment: banner });
const root = schema.properties;
const constants = `
/** The protocol version this client speaks; \`handshake\` sends it. */
export const PROTOCOL_VERSION = ${JSON.stringify(root.protocolVersion.const)} as const;
/** The longest request line the host reads, in bytes, newline excluded. */
export const MAX_LINE_BYTES = ${JSON.stringify(root.maxLineBytes.const)} as const;
/** Every method the host serves, \`$/cancelRequest\` included. */
export const METHOD_NAMES = ${JSON.stringify(Object.keys(schema.$defs.Methods.properties))} as const;
`;
await writeFile(target, types + constants);
console.log(`wrote ${target.pathname}`);
