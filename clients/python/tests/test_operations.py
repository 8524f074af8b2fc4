"""The client's operation table (``runkeep.client.OPERATIONS``, where every
method and path it sends comes from) against the API's own:
``crates/runkeep-http/operations.json``, generated from the Rust operation
table the server is built from (and checked against it by
``cargo test -p runkeep-http``). Needs no server."""

import json
import re
from pathlib import Path

import pytest

import runkeep.client as client
from runkeep.client import OPERATIONS, RUN_PATH, RunRef

REPO = Path(__file__).resolve().parents[3]
TABLE = REPO / "crates" / "runkeep-http" / "operations.json"


def contract() -> dict[str, dict]:
    ops = json.loads(TABLE.read_text(encoding="utf-8"))
    return {op["name"]: op for op in ops}


def full_path(path: str) -> str:
    return RUN_PATH + path[len("{run}") :] if path.startswith("{run}") else path


def test_every_operation_the_client_calls_is_the_table_s_with_its_method_and_path():
    table = contract()
    wrong = []
    for name, (method, path) in OPERATIONS.items():
        op = table.get(name)
        if op is None:
            wrong.append(f"{name}: not an operation of {TABLE.relative_to(REPO)}")
            continue
        ours = (method, full_path(path))
        theirs = (op["method"], op["path"])
        if ours != theirs:
            wrong.append(f"{name}: the client sends {ours[0]} {ours[1]}, the table says {theirs[0]} {theirs[1]}")
    assert not wrong, "\n".join(wrong)


def test_every_path_the_client_builds_comes_from_its_table():
    """No method of the client spells a path or a method of its own: each
    request names its operation (a regression guard on the module's text)."""
    source = Path(client.__file__).read_text(encoding="utf-8")
    body = source.split("class _Api", 1)[1].split("_WRITE_METHODS", 1)[0]
    assert not re.findall(r'"/v1[^"]*"', body), "a path spelled outside OPERATIONS"
    assert not re.findall(r'_Request\("(GET|POST|PUT|DELETE)"', body), "a method spelled outside OPERATIONS"
    sse = (Path(client.__file__).parent / "sse.py").read_text(encoding="utf-8")
    assert '"/v1' not in sse and "/events/stream\"" not in sse, "the tail spells its path"


class _Fake(client._Api):
    tenant = "t 1"


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_operation_s_path_fills_every_parameter(name):
    run = RunRef("p", "s", "r/1", parent="run_parent")
    path = _Fake()._path(name, run, "cp")
    assert "{" not in path and "}" not in path, path
    # Ids are one segment each, percent-encoded.
    assert "/t%201" in path if "{tenant}" in full_path(OPERATIONS[name][1]) else True
    if "{run}" in full_path(OPERATIONS[name][1]):
        assert "/runs/r%2F1" in path, path
