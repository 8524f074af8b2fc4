// The live transcript tail: Server-Sent Events read with fetch (an
// EventSource cannot send the Authorization header), parsed by the
// TypeScript client's parser (sse-parser.js, generated from
// clients/typescript/src/sse.ts), resumed with Last-Event-ID after a
// dropped connection after a doubling pause (the client's backoff,
// backoff.js, generated from clients/typescript/src/backoff.ts). Events are
// delivered in seq order, each once: a seq at or below the last one delivered is
// dropped, so a resumed stream never repeats one, and the server sends
// every event after Last-Event-ID, so none is skipped.

import { getToken } from './api.js';
import { Doubling } from './backoff.js';
import { SseParser } from './sse-parser.js';

export { SseParser };

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
  // 500 ms, doubling to 5 s; from 500 ms again once a connection is live.
  const delays = new Doubling(500, 5000);
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
      delays.reset();
      let refused = null;
      const parser = new SseParser();
      const take = (m) => {
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
      };
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        for (const m of parser.push(value)) take(m);
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
    await sleep(delays.next(), signal);
  }
  return reconnects;
}
