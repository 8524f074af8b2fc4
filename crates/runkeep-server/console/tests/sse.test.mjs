// The console's tail (../sse.js, with the parser it imports from
// ../sse-parser.js) on its own, in Node: against a server that
// drops the connection and one that replays events it was told were seen.
import http from 'node:http';
import { test } from 'node:test';
import assert from 'node:assert/strict';

globalThis.sessionStorage = { getItem: () => 'rk_test', setItem() {}, removeItem() {} };
const { SseParser, tailEvents } = await import('../sse.js');

const frame = (seq) => `event: event\nid: ${seq}\ndata: ${JSON.stringify({ seq, type: 't', payload: {} })}\n\n`;

test('the parser (the TypeScript client\'s, as the console serves it) takes CRLF, CR and LF lines split anywhere, comments and multi-line data', () => {
  const text = ': keep-alive\r\nevent: event\r\nid: 7\r\ndata: {"a":\r\ndata: 1}\r\n\r\nevent: problem\rdata: {}\r\r';
  for (const size of [1, 2, 3, 5, text.length]) {
    const got = [];
    const p = new SseParser();
    for (let i = 0; i < text.length; i += size) got.push(...p.push(text.slice(i, i + size)));
    // The last event id persists across messages, as the format says.
    assert.deepEqual(
      got,
      [
        { event: 'event', data: '{"a":\n1}', id: '7', retry: undefined },
        { event: 'problem', data: '{}', id: '7', retry: undefined },
      ],
      `chunks of ${size}`,
    );
  }
});

test('a dropped stream is resumed after the last seq, and events sent again are not delivered twice', async () => {
  const seen = []; // Last-Event-ID of each connection
  const server = http.createServer((req, res) => {
    seen.push(req.headers['last-event-id']);
    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
    if (seen.length === 1) {
      res.write(frame(1) + frame(2));
      setTimeout(() => req.socket.destroy(), 50); // the connection drops
    } else {
      // A server that replays from the start: the client must drop 1 and 2.
      res.write(frame(1) + frame(2) + frame(3));
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${server.address().port}/stream`;
  const abort = new AbortController();
  const delivered = [];
  const states = [];
  const done = tailEvents(url, {
    since: 0,
    signal: abort.signal,
    onState: (s) => states.push(s),
    onEvent: (ev) => {
      delivered.push(ev.seq);
      if (ev.seq === 3) abort.abort();
    },
  });
  const reconnects = await done;
  server.closeAllConnections();
  server.close();
  assert.deepEqual(delivered, [1, 2, 3]);
  assert.deepEqual(seen, ['0', '2'], 'the resume asked for the events after #2');
  assert.equal(reconnects, 1);
  assert.ok(states.includes('reconnecting'));
});
