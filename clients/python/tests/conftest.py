import asyncio
import inspect
import threading
from typing import Any

import pytest

from runkeep import AsyncRunkeepClient, RunkeepClient
from runkeep.testing import Serve


@pytest.fixture(scope="module")
def serve():
    s = Serve()
    yield s
    s.close()


class Blocking:
    """An :class:`AsyncRunkeepClient` driven from sync test code: each of
    its coroutines runs to its end on one background event loop, so a test
    written against ``RunkeepClient`` runs unchanged over the async client."""

    def __init__(self, client: AsyncRunkeepClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop

    def wait(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            return self.wait(out) if inspect.isawaitable(out) else out

        return call


@pytest.fixture(params=["sync", "async"])
def connect(request, serve):
    """``connect(role)``: a client of ``serve`` with ``role``'s token, a
    ``RunkeepClient`` or (the ``async`` run) an ``AsyncRunkeepClient``
    behind :class:`Blocking`. Keywords: ``token``, ``tenant`` (``None``:
    the token's), ``transport``."""
    kind = request.param
    made: list[Any] = []
    loop = asyncio.new_event_loop() if kind == "async" else None
    if loop is not None:
        threading.Thread(target=loop.run_forever, daemon=True).start()

    def make(role: str = "operator", *, token: str | None = None, tenant: str | None = serve.tenant, transport: Any = None, url: str | None = None) -> Any:
        token = token or serve.tokens[role]
        url = url or serve.url
        if loop is None:
            c: Any = RunkeepClient(url, token, tenant=tenant, transport=transport)
        else:
            c = Blocking(AsyncRunkeepClient(url, token, tenant=tenant, transport=transport), loop)
        made.append(c)
        return c

    make.kind = kind
    yield make
    for c in made:
        if isinstance(c, Blocking):
            c.wait(c.client.aclose())
        else:
            c.close()
    if loop is not None:
        loop.call_soon_threadsafe(loop.stop)
