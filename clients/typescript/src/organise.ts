/**
 * Find and organise (issue 35): typed helpers over `session.search`, the paged
 * `session.list`, `session.update` and `session.fork`, and the snippet's ranges as string
 * slices. The host counts a snippet's ranges in code points; JavaScript strings are UTF-16,
 * so an emoji before a match would shift a naive `slice`: use `highlight`.
 */

import type { CallOptions, HostClient, Params, Result } from "./client.js";

export type SearchParams = Params<"session.search">;
export type SearchResult = Result<"session.search">;
export type SearchHit = SearchResult["hits"][number];
export type ListParams = Params<"session.list">;
export type SessionSummary = Result<"session.list">["sessions"][number];

/** One page of hits (`cursor` in the result when more may follow). */
export function search(
  client: HostClient,
  params: SearchParams,
  options?: CallOptions,
): Promise<SearchResult> {
  return client.call("session.search", params, options);
}

/** Every session, page by page, in the order asked (`limit` is the page size). */
export async function* listSessions(
  client: HostClient,
  params: Omit<ListParams, "cursor"> = {},
  options?: CallOptions,
): AsyncGenerator<SessionSummary> {
  let cursor: string | undefined;
  do {
    const page = await client.call(
      "session.list",
      cursor === undefined ? params : { ...params, cursor },
      options,
    );
    yield* page.sessions;
    cursor = page.cursor;
  } while (cursor !== undefined);
}

/** Set a session's title and merge its `meta` (a key set to `null` is removed). */
export function updateSession(
  client: HostClient,
  params: Params<"session.update">,
  options?: CallOptions,
): Promise<Result<"session.update">> {
  return client.call("session.update", params, options);
}

/** A new session holding the lines up to and including `atMessageId`. */
export function forkSession(
  client: HostClient,
  params: Params<"session.fork">,
  options?: CallOptions,
): Promise<Result<"session.fork">> {
  return client.call("session.fork", params, options);
}

/** A snippet cut into its plain and matching parts (ranges are code points, not UTF-16). */
export function highlight(snippet: {
  text: string;
  ranges: readonly (readonly number[])[];
}): { text: string; match: boolean }[] {
  const points = Array.from(snippet.text);
  const out: { text: string; match: boolean }[] = [];
  let at = 0;
  for (const [start = 0, end = 0] of snippet.ranges) {
    if (start > at) out.push({ text: points.slice(at, start).join(""), match: false });
    out.push({ text: points.slice(start, end).join(""), match: true });
    at = end;
  }
  if (at < points.length) out.push({ text: points.slice(at).join(""), match: false });
  return out;
}
