/**
 * NDJSON framing on bytes: a line ends at the byte 0x0A, never at a string boundary.
 *
 * A stream's chunks fall anywhere, also inside a UTF-8 character (an emoji is four bytes),
 * so chunks are kept as bytes and only a whole line is decoded. Decoding chunk by chunk
 * (`chunk.toString()`) would turn a split character into two U+FFFD.
 */

const NEWLINE = 0x0a;

/** Splits a byte stream into lines (without their `\n`); call {@link push} per chunk. */
export class LineSplitter {
  readonly #onLine: (line: Buffer) => void;
  #parts: Buffer[] = [];
  #size = 0;

  constructor(onLine: (line: Buffer) => void) {
    this.#onLine = onLine;
  }

  /** Bytes held of a line not yet ended. */
  get pending(): number {
    return this.#size;
  }

  /** Feed one chunk; every line it completes is passed on, in order. */
  push(chunk: Buffer): void {
    let start = 0;
    for (;;) {
      const end = chunk.indexOf(NEWLINE, start);
      if (end < 0) break;
      this.#onLine(this.#take(chunk.subarray(start, end)));
      start = end + 1;
    }
    if (start < chunk.length) {
      this.#parts.push(chunk.subarray(start));
      this.#size += chunk.length - start;
    }
  }

  #take(last: Buffer): Buffer {
    if (this.#parts.length === 0) return last;
    this.#parts.push(last);
    const line = Buffer.concat(this.#parts, this.#size + last.length);
    this.#parts = [];
    this.#size = 0;
    return line;
  }
}
