/** The SSE parser: chunks cut anywhere, line ends, comments, ids. */

import assert from "node:assert/strict";
import { test } from "node:test";

import { SseParser, sseMessages } from "../src/index.js";

const STREAM =
  ": keep-alive\n\nevent: event\nid: 1\ndata: {\"seq\":1}\n\n" +
  "event: event\r\nid: 2\r\ndata: {\"seq\":\r\ndata: 2}\r\n\r\n" +
  "id: 3\rdata: plain\r\r" +
  "event: problem\ndata: {}\n\n";

test("every split of a stream into two chunks parses the same", () => {
  const whole = new SseParser().push(STREAM);
  assert.deepEqual(
    whole.map((m) => [m.event, m.id, m.data]),
    [
      ["event", "1", '{"seq":1}'],
      ["event", "2", '{"seq":\n2}'],
      ["message", "3", "plain"],
      ["problem", "3", "{}"],
    ],
  );
  for (let cut = 0; cut <= STREAM.length; cut++) {
    const p = new SseParser();
    const got = [...p.push(STREAM.slice(0, cut)), ...p.push(STREAM.slice(cut))];
    assert.deepEqual(got, whole, `cut at ${cut}`);
  }
});

test("one character at a time parses the same", () => {
  const p = new SseParser();
  const got = [...STREAM].flatMap((c) => p.push(c));
  assert.deepEqual(got, new SseParser().push(STREAM));
});

test("a message without its blank line is not dispatched, and its id is not the last seen", async () => {
  const p = new SseParser("4");
  const body = new Blob(["id: 5\ndata: {\"seq\":5}\n\nid: 6\ndata: {\"seq\":6}\n"]).stream();
  const got = [];
  for await (const m of sseMessages(body, p)) got.push(m.id);
  assert.deepEqual(got, ["5"]);
  assert.equal(p.lastEventId, "5");
});

test("a NUL in an id is ignored; a field without a colon is a field with an empty value", () => {
  const p = new SseParser();
  const got = p.push("id: a\0b\ndata\n\n");
  assert.deepEqual(
    got.map((m) => [m.id, m.data]),
    [[undefined, ""]],
  );
});
