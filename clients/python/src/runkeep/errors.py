"""Errors typed from the server's RFC 9457 problem details.

Every non-2xx answer of the API is ``application/problem+json`` with a
``type`` of ``urn:runkeep:problem:<slug>``. :func:`problem_error` maps it to
the subclass of :class:`RunkeepError` for that slug, carrying the kind's
extension members (``FencedOut.presented`` / ``.current``,
``InvalidInput.field``, ``Conflict.first_answer``, ``RetryLater.retry_after``,
``Cancelled.reason`` …). ``lost_holding`` says the writer no longer holds
the run (fenced out, or cancelled by an operator). A ``type`` the client does not know still raises a ``RunkeepError``
with the type, status and detail, never a silent success.

Failures below HTTP (no connection, a reset, no answer in time) are
:class:`ConnectionFailed`; ``outcome_unknown`` says whether a write may have
landed (read back before repeating it).
"""

from __future__ import annotations

import email.utils
import time
from typing import Any, Mapping

TYPE_PREFIX = "urn:runkeep:problem:"


class RunkeepError(Exception):
    """Any error answered by, or on the way to, a runkeep server."""

    #: True when the same call may succeed later, unchanged.
    retryable: bool = False
    #: True when the refusal means the writer no longer holds the run
    #: (:class:`FencedOut`, :class:`Cancelled`): stop working on it, and
    #: do not release, finish or report anything more for it.
    lost_holding: bool = False

    def __init__(
        self,
        problem: Mapping[str, Any],
        *,
        method: str | None = None,
        path: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.problem: dict[str, Any] = dict(problem)
        self.type: str = str(problem.get("type", ""))
        self.slug: str | None = (
            self.type[len(TYPE_PREFIX) :] if self.type.startswith(TYPE_PREFIX) else None
        )
        self.status: int = int(problem.get("status", 0) or 0)
        self.title: str = str(problem.get("title", ""))
        self.detail: str | None = problem.get("detail")
        self.instance: str | None = problem.get("instance")
        self.method = method
        self.path = path
        self._retry_after = retry_after
        where = f" ({method} {path})" if method and path else ""
        super().__init__(f"{self.title}: {self.detail or self.title}{where}")


class NotFound(RunkeepError):
    """``not-found`` (404): no such run or route, or another tenant's."""


class InvalidInput(RunkeepError):
    """``invalid-input`` (400), with ``field`` when the server knows it."""

    @property
    def field(self) -> str | None:
        return self.problem.get("field")


class MalformedBody(InvalidInput):
    """``malformed-body`` (400): not the JSON the route takes."""


class PayloadTooLarge(RunkeepError):
    """``payload-too-large`` (413)."""


class FencedOut(RunkeepError):
    """``fenced-out`` (409): the write's fence was superseded.

    ``presented`` is the fence the write carried, ``current`` the run's top
    holding. The holder lost the run: stop working on it.
    """

    lost_holding = True

    def __init__(self, problem: Mapping[str, Any], **kw: Any) -> None:
        super().__init__(problem, **kw)
        presented, current = problem.get("presented"), problem.get("current")
        if not isinstance(presented, int) or not isinstance(current, int):
            raise RunkeepError(
                {
                    "type": TYPE_PREFIX + "corrupted",
                    "title": "Malformed problem",
                    "status": self.status,
                    "detail": f"the server answered fenced-out without its fences: {self.detail}",
                },
                method=kw.get("method"),
                path=kw.get("path"),
            )
        self.presented: int = presented
        self.current: int = current
        self.run: str | None = problem.get("run")
        self.operation: str | None = problem.get("operation")


class Cancelled(RunkeepError):
    """``cancelled`` (409): an operator cancelled the run. A holder's write
    (or failure report) on it is refused with this: the run is finished as
    ``cancelled`` and no longer this holder's; stop its work and report
    nothing more for it. ``run``, ``operation`` (the refused act) and the
    operator's ``reason``."""

    lost_holding = True

    @property
    def run(self) -> str | None:
        return self.problem.get("run")

    @property
    def operation(self) -> str | None:
        return self.problem.get("operation")

    @property
    def reason(self) -> str | None:
        return self.problem.get("reason")


class RetryLater(RunkeepError):
    """A kind that may succeed later (``retry_after`` seconds, from the
    ``Retry-After`` header; 1 s when absent)."""

    retryable = True

    @property
    def retry_after(self) -> float:
        return self._retry_after if self._retry_after is not None else 1.0


class Contended(RetryLater):
    """``contended`` (503): lost every attempt to other takers."""

    @property
    def attempts(self) -> int | None:
        return self.problem.get("attempts")


class Unavailable(RetryLater):
    """``unavailable`` (503). ``outcome_unknown``: a write may have landed."""

    @property
    def outcome_unknown(self) -> bool:
        return self.problem.get("outcomeUnknown") is True


class Overloaded(RetryLater):
    """``overloaded`` (503): the server is at its concurrency limit."""


class Timeout(RunkeepError):
    """``timeout`` (408): the request took longer than the server allows."""

    retryable = True


class Conflict(RunkeepError):
    """``conflict`` (409). A second park answer carries the first:
    ``first_answer`` and ``resolved_at``."""

    @property
    def first_answer(self) -> Any:
        return self.problem.get("firstAnswer")

    @property
    def resolved_at(self) -> int | None:
        return self.problem.get("resolvedAt")


class Unsupported(RunkeepError):
    """``unsupported`` (422)."""


class Corrupted(RunkeepError):
    """``corrupted`` (500)."""


class Backend(RunkeepError):
    """``backend`` (500)."""


class Unauthorized(RunkeepError):
    """``unauthorized`` (401): no or unknown token."""


class Forbidden(RunkeepError):
    """``forbidden`` (403): the role is too low (``required_role``), or the
    run's holding is not one this token may write under
    (``not_your_holding``: a fenced act on a holding another token claimed,
    or an unfenced write while a lease is on top; the store judges it with
    the fence: stop working on the run)."""

    @property
    def required_role(self) -> str | None:
        return self.problem.get("requiredRole")

    @property
    def not_your_holding(self) -> bool:
        """True when the refusal is about the run's holding, not the role."""
        return isinstance(self.problem.get("run"), str) and isinstance(self.problem.get("current"), int)

    @property
    def run(self) -> str | None:
        """For ``not_your_holding``: the run."""
        return self.problem.get("run") if self.not_your_holding else None

    @property
    def holding_fence(self) -> int | None:
        """For ``not_your_holding``: the fence of the holding that is not this token's."""
        return self.problem.get("current") if self.not_your_holding else None

    @property
    def presented(self) -> int | None:
        """For ``not_your_holding``: the fence the refused act presented (None: unfenced)."""
        return self.problem.get("presented") if self.not_your_holding else None


class UnsupportedMediaType(RunkeepError):
    """``unsupported-media-type`` (415)."""


class MethodNotAllowed(RunkeepError):
    """``method-not-allowed`` (405)."""


class ConnectionFailed(RunkeepError):
    """No answer from the server (refused, reset, timed out).

    ``outcome_unknown`` is true when the request may have reached the
    server (a write may have landed: read back before repeating it).
    """

    retryable = True

    def __init__(self, detail: str, *, method: str, path: str, outcome_unknown: bool) -> None:
        super().__init__(
            {
                "type": "urn:runkeep:client:connection",
                "title": "No answer from the server",
                "status": 0,
                "detail": detail,
            },
            method=method,
            path=path,
        )
        self.outcome_unknown = outcome_unknown


BY_SLUG: dict[str, type[RunkeepError]] = {
    "not-found": NotFound,
    "invalid-input": InvalidInput,
    "fenced-out": FencedOut,
    "cancelled": Cancelled,
    "contended": Contended,
    "conflict": Conflict,
    "unsupported": Unsupported,
    "corrupted": Corrupted,
    "unavailable": Unavailable,
    "backend": Backend,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "malformed-body": MalformedBody,
    "unsupported-media-type": UnsupportedMediaType,
    "payload-too-large": PayloadTooLarge,
    "method-not-allowed": MethodNotAllowed,
    "timeout": Timeout,
    "overloaded": Overloaded,
}


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def problem_error(
    problem: Mapping[str, Any],
    *,
    method: str | None = None,
    path: str | None = None,
    retry_after: float | None = None,
) -> RunkeepError:
    """The typed error for a problem body."""
    t = str(problem.get("type", ""))
    cls = BY_SLUG.get(t[len(TYPE_PREFIX) :], RunkeepError) if t.startswith(TYPE_PREFIX) else RunkeepError
    return cls(problem, method=method, path=path, retry_after=retry_after)
