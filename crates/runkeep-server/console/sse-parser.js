// Generated from clients/typescript/src/sse.ts by `npm run console-sse`
// (clients/typescript/scripts/console-sse.mjs). Do not edit: change the
// client's parser and regenerate. The console serves it as it is.

/**
 * An incremental Server-Sent Events parser (the WHATWG event-stream
 * format): feed it text as it arrives, in chunks cut anywhere, and it yields
 * each complete message once its terminating blank line has arrived.
 *
 * Lines end with `\n`, `\r\n` or `\r` (a `\r` at the end of one chunk and a
 * `\n` at the start of the next are one line end). Comment lines (`:` —
 * the server's keep-alives) are ignored, `data` lines are joined with `\n`,
 * an `id` containing NUL is ignored, a message with no `data` is not
 * dispatched. A message cut off by the end of the stream (no blank line) is
 * dropped, as the format requires: its `id` is not taken as seen, so a
 * resumed tail asks for it again.
 *
 * @module
 */
/** The parser's state between chunks. */
export class SseParser {
    buffer = "";
    pendingCr = false;
    data = [];
    hasData = false;
    eventType = "";
    retry;
    idBuffer;
    /**
     * The last event id, as of the last dispatch (a blank line). It persists
     * across messages, as the format says.
     */
    lastEventId;
    constructor(lastEventId) {
        this.lastEventId = lastEventId;
        this.idBuffer = lastEventId;
    }
    /** Feeds a chunk; returns the messages it completed. */
    push(chunk) {
        const out = [];
        let text = chunk;
        if (this.pendingCr && text.startsWith("\n"))
            text = text.slice(1);
        this.pendingCr = false;
        this.buffer += text;
        let start = 0;
        for (;;) {
            const cr = this.buffer.indexOf("\r", start);
            const lf = this.buffer.indexOf("\n", start);
            if (cr < 0 && lf < 0)
                break;
            let end;
            let next;
            if (cr >= 0 && (lf < 0 || cr < lf)) {
                end = cr;
                if (cr + 1 < this.buffer.length) {
                    next = this.buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
                }
                else {
                    // A `\r` at the very end: the line ended; skip a `\n` that may open the next chunk.
                    next = cr + 1;
                    this.pendingCr = true;
                }
            }
            else {
                end = lf;
                next = lf + 1;
            }
            const msg = this.line(this.buffer.slice(start, end));
            if (msg)
                out.push(msg);
            start = next;
        }
        this.buffer = this.buffer.slice(start);
        return out;
    }
    line(line) {
        if (line === "")
            return this.dispatch();
        if (line.startsWith(":"))
            return undefined;
        const colon = line.indexOf(":");
        let field;
        let value;
        if (colon < 0) {
            field = line;
            value = "";
        }
        else {
            field = line.slice(0, colon);
            value = line.slice(colon + 1);
            if (value.startsWith(" "))
                value = value.slice(1);
        }
        switch (field) {
            case "event":
                this.eventType = value;
                break;
            case "data":
                this.data.push(value);
                this.hasData = true;
                break;
            case "id":
                if (!value.includes("\0"))
                    this.idBuffer = value;
                break;
            case "retry":
                if (/^\d+$/.test(value))
                    this.retry = Number(value);
                break;
            default:
                break;
        }
        return undefined;
    }
    dispatch() {
        const retry = this.retry;
        this.retry = undefined;
        this.lastEventId = this.idBuffer;
        if (!this.hasData) {
            this.eventType = "";
            return undefined;
        }
        const msg = {
            event: this.eventType || "message",
            data: this.data.join("\n"),
            id: this.lastEventId,
            retry,
        };
        this.data = [];
        this.hasData = false;
        this.eventType = "";
        return msg;
    }
}
/**
 * The SSE messages of a byte stream, as an async iterator. Cancels the
 * stream's reader when the consumer stops early.
 */
export async function* sseMessages(body, parser = new SseParser()) {
    const reader = body.getReader();
    const decoder = new TextDecoder("utf-8");
    try {
        for (;;) {
            const { done, value } = await reader.read();
            if (done) {
                // Flush the decoder; a message without its blank line is dropped.
                parser.push(decoder.decode());
                return;
            }
            for (const m of parser.push(decoder.decode(value, { stream: true })))
                yield m;
        }
    }
    finally {
        await reader.cancel().catch(() => undefined);
    }
}
