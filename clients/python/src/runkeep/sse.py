"""The live event tail: Server-Sent Events with resumption.

``GET …/events/stream`` sends each event as ``event: event`` with its
``seq`` as ``id``; a reconnect sends ``Last-Event-ID`` (the last ``seq``
seen), and the server resumes right after it. So a tail that drops, for
any reason, loses and repeats nothing. A ``problem`` frame (the log can no
longer be read) raises its typed error.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, Iterator

import httpx

from .errors import RunkeepError, problem_error

if TYPE_CHECKING:  # pragma: no cover
    from .client import AsyncRunkeepClient, RunkeepClient, RunRef


class SseParser:
    """Incremental SSE parser: feed lines, get ``(event, id, data)`` frames."""

    def __init__(self) -> None:
        self._event = ""
        self._id: str | None = None
        self._data: list[str] = []

    def line(self, line: str) -> tuple[str, str | None, str] | None:
        if line == "":
            if not self._data and not self._event:
                return None
            frame = (self._event or "message", self._id, "\n".join(self._data))
            self._event, self._id, self._data = "", None, []
            return frame
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            self._id = value
        return None


def _frames(lines: Iterable[str], parser: SseParser) -> Iterator[tuple[str, str | None, str]]:
    for line in lines:
        f = parser.line(line.rstrip("\r"))
        if f is not None:
            yield f


def _event_of(frame: tuple[str, str | None, str], path: str) -> dict[str, Any] | None:
    event, _id, data = frame
    if event == "event":
        ev: dict[str, Any] = json.loads(data)
        return ev
    if event == "problem":
        raise problem_error(json.loads(data), method="GET", path=path)
    return None


def _open_error(res: httpx.Response, path: str) -> RunkeepError:
    try:
        problem = json.loads(res.read())
    except ValueError:
        problem = {"type": "about:blank", "title": "HTTP error", "status": res.status_code}
    return problem_error(problem, method="GET", path=path)


def tail_sync(client: "RunkeepClient", run: "RunRef", since_seq: int, delay: float) -> Iterator[dict[str, Any]]:
    path = client._path("tail_events", run)
    last = since_seq
    while True:
        params: dict[str, Any] = {"sinceSeq": since_seq}
        if run.parent:
            params["parent"] = run.parent
        headers = {"accept": "text/event-stream"}
        if last:
            headers["last-event-id"] = str(last)
        try:
            with client._http.stream("GET", path, params=params, headers=headers, timeout=httpx.Timeout(10.0, read=None)) as res:
                if not res.is_success:
                    err = _open_error(res, path)
                    if not err.retryable:
                        raise err
                else:
                    for frame in _frames(res.iter_lines(), SseParser()):
                        ev = _event_of(frame, path)
                        if ev is None:
                            continue
                        seq = int(ev["seq"])
                        if seq <= last:
                            continue
                        last = seq
                        yield ev
        except httpx.TransportError:
            pass
        time.sleep(delay)


async def tail_async(client: "AsyncRunkeepClient", run: "RunRef", since_seq: int, delay: float) -> AsyncIterator[dict[str, Any]]:
    await client.connect()
    path = client._path("tail_events", run)
    last = since_seq
    while True:
        params: dict[str, Any] = {"sinceSeq": since_seq}
        if run.parent:
            params["parent"] = run.parent
        headers = {"accept": "text/event-stream"}
        if last:
            headers["last-event-id"] = str(last)
        try:
            async with client._http.stream("GET", path, params=params, headers=headers, timeout=httpx.Timeout(10.0, read=None)) as res:
                if not res.is_success:
                    await res.aread()
                    err = _open_error(res, path)
                    if not err.retryable:
                        raise err
                else:
                    parser = SseParser()
                    async for line in res.aiter_lines():
                        frame = parser.line(line.rstrip("\r"))
                        if frame is None:
                            continue
                        ev = _event_of(frame, path)
                        if ev is None:
                            continue
                        seq = int(ev["seq"])
                        if seq <= last:
                            continue
                        last = seq
                        yield ev
        except httpx.TransportError:
            pass
        await asyncio.sleep(delay)
