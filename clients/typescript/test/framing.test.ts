/** NDJSON framing on bytes: lines end at 0x0A wherever the chunks fall. */

import assert from "node:assert/strict";
import { test } from "node:test";

import { LineSplitter } from "../src/index.js";

function split(chunks: Buffer[]): { lines: string[]; pending: number } {
  const lines: string[] = [];
  const splitter = new LineSplitter((line) => lines.push(line.toString("utf8")));
  for (const chunk of chunks) splitter.push(chunk);
  return { lines, pending: splitter.pending };
}

test("a character split between chunks survives", () => {
  const bytes = Buffer.from('{"t":"Lyon 😀 é"}\n', "utf8");
  const emoji = bytes.indexOf(Buffer.from("😀", "utf8"));
  for (let cut = emoji + 1; cut < emoji + 4; cut++) {
    const { lines } = split([bytes.subarray(0, cut), bytes.subarray(cut)]);
    assert.deepEqual(lines, ['{"t":"Lyon 😀 é"}']);
  }
  const { lines } = split([...bytes].map((b) => Buffer.from([b]))); // one byte at a time
  assert.deepEqual(lines, ['{"t":"Lyon 😀 é"}']);
});

test("several lines in one chunk, one line over many, and a tail kept for later", () => {
  const { lines, pending } = split([
    Buffer.from("one\ntwo\nth"),
    Buffer.from("r"),
    Buffer.from("ee\n\nfo"),
  ]);
  assert.deepEqual(lines, ["one", "two", "three", ""]);
  assert.equal(pending, 2);
});
