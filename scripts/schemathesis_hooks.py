"""Schemathesis hooks for scripts/schemathesis.sh (loaded with SCHEMATHESIS_HOOKS).

They keep the run bounded in time and set aside what no OpenAPI document can
state. Each is listed here with its reason; nothing else is filtered.

Sent differently from how it was generated (`before_call`):

- Long-polls answer after their wait: `timeoutMs` (the runnable and events
  waits; 25 s when absent) and `waitMs` (claim-next; claim-next-batch's
  `claim.waitMs`) are sent as at most
  100 ms, so a case costs milliseconds, not up to 30 s.
- `cursor` is opaque: only a cursor the server issued for the same order,
  filters and scope is valid, so a generated one is not sent.
- `session` narrows a listing only together with `project`; a query's
  parameters cannot state that one needs the other, so a `session` without
  a `project` is not sent. (A body can: ClaimNextBody's `dependentSchemas`.)
- A whole number generated as a float (`2.0`, which JSON Schema 2020-12
  counts as an integer) is sent as an integer (`2`): the server reads
  integer fields with serde, which takes `2` and refuses `2.0`
  (400 `malformed-body`, "invalid type: floating point").

Not counted as "valid request rejected" (`filter_failure`), because validity
depends on the store's state, which a document cannot describe:

- a fence that was never issued for the run (400 `invalid-input`, "presented
  fence N, but no fence was ever issued for this run" / "... the highest
  fence ever issued for this run is M; it was never issued").
- a checkpoint listing's `after` naming a checkpoint the run does not have
  (400 `invalid-input`, field `after`, "the run has no checkpoint …"):
  `after` is the last id of a page the server answered.

Nor, because no JSON Schema states a grammar or a registry:

- a schedule's cron expression that does not parse (400 `invalid-input`,
  "cron expression …"), or that never fires ("… never fires after its
  creation"), and a time zone that is not an IANA name ("time zone …"):
  the document bounds their length only;
- a schedule body naming another schedule than its path ("the body names
  schedule …"), and a missed-tick policy whose `max` does not go with its
  `policy` ("missed is …"): rules between two values, which these bodies'
  schemas do not state.
"""

import re

import schemathesis

# The longest wait sent (ms).
MAX_SENT_WAIT_MS = 100
MAX_WAIT_MS = 30_000

# Refusals of a schema-valid request that depend on the store's state.
STATE_DEPENDENT = [
    re.compile(r"presented fence \d+, but no fence was ever issued for this run"),
    re.compile(r"presented fence \d+, but the highest fence ever issued for this run is \d+; it was never issued"),
    re.compile(r"the run has no checkpoint \".*\" \(deleted since the previous page\?\)"),
    # Not state, but nothing a schema can state (module docs).
    re.compile(r"^cron expression "),
    re.compile(r"never fires after its creation$"),
    re.compile(r"^time zone "),
    re.compile(r"^the body names schedule "),
    re.compile(r"^missed is "),
]


def _as_int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _shorten(container, key):
    if key not in container or container[key] is None:
        # The waits' default is 25 s; send none instead.
        if key == "timeoutMs":
            container[key] = 0
        return
    n = _as_int(container[key])
    if n is not None and 0 <= n <= MAX_WAIT_MS:
        container[key] = min(n, MAX_SENT_WAIT_MS)


def _whole_floats_as_ints(value):
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_floats_as_ints(v) for v in value]
    return value


def _operation_id(case):
    return case.operation.definition.raw.get("operationId", "")


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    op = _operation_id(case)
    waits = op in ("wait_runnable", "wait_events")
    if case.query is None and waits:
        case.query = {}
    query = case.query
    if isinstance(query, dict):
        query.pop("cursor", None)
        if "session" in query and "project" not in query:
            query.pop("session")
        if waits:
            _shorten(query, "timeoutMs")
    if isinstance(case.body, (dict, list)):
        case.body = _whole_floats_as_ints(case.body)
        if op == "claim_next" and isinstance(case.body, dict):
            _shorten(case.body, "waitMs")
        if op == "claim_next_batch" and isinstance(case.body, dict) and isinstance(case.body.get("claim"), dict):
            _shorten(case.body["claim"], "waitMs")


@schemathesis.hook
def filter_failure(ctx, failure, case, response):
    if response is None or response.status_code != 400:
        return True
    # ST202: "Schema-valid request rejected" (positive_data_acceptance).
    if getattr(failure, "code", None) != "ST202":
        return True
    try:
        problem = response.json()
    except Exception:
        return True
    if not isinstance(problem, dict) or problem.get("type") != "urn:runkeep:problem:invalid-input":
        return True
    detail = str(problem.get("detail", ""))
    return not any(p.search(detail) for p in STATE_DEPENDENT)


# `RUNKEEP_SCHEMATHESIS_LOG=FILE` appends every 4xx answer (operation, status,
# problem type and detail) to FILE: what the server refused, and why.
_LOG = __import__("os").environ.get("RUNKEEP_SCHEMATHESIS_LOG")


@schemathesis.hook
def after_call(ctx, case, response):
    if not _LOG or not (400 <= response.status_code < 500):
        return
    try:
        problem = response.json()
    except Exception:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    mode = getattr(getattr(getattr(case, "meta", None), "generation", None), "mode", None)
    with open(_LOG, "a", encoding="utf-8") as f:
        f.write(
            f"{_operation_id(case)}\t{response.status_code}\t{getattr(mode, 'value', mode)}\t"
            f"{problem.get('type', '')}\t{problem.get('field', '')}\t{str(problem.get('detail', ''))[:300]}\n"
        )
