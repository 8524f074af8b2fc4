// The live transcript tail: Server-Sent Events read with fetch (an
// EventSource cannot send the Authorization header), parsed here, resumed
// with Last-Event-ID after a dropped connection. Events are delivered in
// seq order, each once: a seq at or below the last one delivered is
// dropped, so a resumed stream never repeats one, and the server sends
// every event after Last-Event-ID, so none is skipped.

import { getToken } from './api.js';

/**
 * Parses SSE text chunks into messages `{event, data, id}`.
 * Feed it chunks with `push(text)`; it calls `onMessage` per message.
 */
export class SseParser {
  constructor(onMessage) {
    this.onMessage = onMessage;
    this.buffer = '';
    this.skipLF = false;
    this.reset();
  }

  reset() {
    this.event = '';
    this.data = [];
    this.id = null;
  }

  push(chunk) {
    // A \r that ended the last chunk may be the first half of a \r\n.
    if (this.skipLF && chunk.startsWith('\n')) chunk = chunk.slice(1);
    this.skipLF = false;
    this.buffer += chunk;
    let at;
    // A line ends with \n, \r\n or \r.
    while ((at = this.buffer.search(/\r\n|\n|\r/)) >= 0) {
      const line = this.buffer.slice(0, at);
      const crlf = this.buffer.startsWith('\r\n', at);
      if (!crlf && this.buffer[at] === '\r' && at === this.buffer.length - 1) this.skipLF = true;
      this.buffer = this.buffer.slice(at + (crlf ? 2 : 1));
      this.line(line);
    }
  }

  line(line) {
    if (line === '') {
      if (this.data.length > 0 || this.event) {
        this.onMessage({ event: this.event || 'message', data: this.data.join('\n'), id: this.id });
      }
      this.reset();
      return;
    }
    if (line.startsWith(':')) return; // a comment: the keep-alive
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.event = value;
    else if (field === 'data') this.data.push(value);
    else if (field === 'id') this.id = value;
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(t);
      resolve();
    }, { once: true });
  });

/**
 * Tails a run's events from after `since` until `signal` aborts.
 *
 * - `onEvent(event)`: each event once, in seq order.
 * - `onState(state, detail)`: `connecting`, `live`, `reconnecting`
 *   (detail: attempts so far), `ended` (a refusal: detail is the problem).
 * Returns the reconnect count when it stops.
 */
export async function tailEvents(url, { since = 0, onEvent, onState = () => {}, signal }) {
  let last = since;
  let reconnects = 0;
  let delay = 500;
  while (!signal?.aborted) {
    onState(reconnects === 0 ? 'connecting' : 'reconnecting', reconnects);
    try {
      const res = await fetch(url, {
        headers: {
          Accept: 'text/event-stream',
          Authorization: `Bearer ${getToken()}`,
          'Last-Event-ID': String(last),
        },
        cache: 'no-store',
        credentials: 'omit',
        signal,
      });
      if (!res.ok) {
        let problem = {};
        try {
          problem = await res.json();
        } catch {
          problem = { title: res.statusText };
        }
        // Refusals (no such run, the token revoked, a bad request) do not
        // get better by retrying; an overloaded or unavailable server does.
        if (res.status < 500) {
          onState('ended', problem);
          return reconnects;
        }
        throw new Error(problem.detail || res.statusText);
      }
      onState('live', reconnects);
      delay = 500;
      let refused = null;
      const parser = new SseParser((m) => {
        if (m.event === 'problem') {
          try {
            refused = JSON.parse(m.data);
          } catch {
            refused = { title: 'the stream ended with a problem' };
          }
          return;
        }
        if (m.event !== 'event') return;
        let ev;
        try {
          ev = JSON.parse(m.data);
        } catch {
          return;
        }
        const seq = Number(m.id ?? ev.seq);
        if (!Number.isSafeInteger(seq) || seq <= last) return; // seen already
        last = seq;
        onEvent(ev);
      });
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.push(value);
        if (refused) {
          reader.cancel().catch(() => {});
          onState('ended', refused);
          return reconnects;
        }
      }
    } catch (e) {
      if (signal?.aborted) break;
    }
    if (signal?.aborted) break;
    // The connection dropped (or the server ended the stream): resume
    // after the last seq delivered.
    reconnects += 1;
    onState('reconnecting', reconnects);
    await sleep(delay, signal);
    delay = Math.min(delay * 2, 5000);
  }
  return reconnects;
}
