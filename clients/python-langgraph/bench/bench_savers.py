"""The saver bench: runkeep's LangGraph saver (over HTTP, on a directory store
and on PostgreSQL) beside PostgresSaver, SqliteSaver and InMemorySaver, in one
run, the savers alternated in every round (shuffled order) so machine noise
spreads over all of them evenly.

Phases, in this order (see BENCHMARKS.md, "LangGraph savers"):
  (b) chat thread: one thread per saver invoked T times (messages with
      add_messages, a node appends a reply), per-turn latency;
  (e) storage of that thread after T turns (measured right after (b), when
      the chat threads are all each store holds);
  (a) per invocation: a 3-node StateGraph, N invocations each on a fresh
      thread, then N on one thread (sync API; plus the async API on fresh
      threads as extra rows);
  (c) put throughput: put + put_writes pairs on one thread;
  (d) latest read at length: get_tuple of the latest checkpoint at each
      length of --lengths.

Every phase checks afterwards that each saver stored what it was given (the
latest checkpoint read back: message counts, counters, checkpoint ids); a
failed check exits 1. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Callable, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

BASELINE = "postgres"


# -- graphs ----------------------------------------------------------------
class Small(TypedDict):
    n: Annotated[int, operator.add]
    last: str


def small_graph() -> StateGraph:
    g = StateGraph(Small)
    g.add_node("a", lambda s: {"n": 1, "last": "a"})
    g.add_node("b", lambda s: {"n": 1, "last": "b"})
    g.add_node("c", lambda s: {"n": 1, "last": f"c{s['n'] + 1}"})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


FILLER = "lorem ipsum dolor sit amet, consectetur adipiscing elit. "


def human(turn: int) -> str:
    return f"turn {turn}: " + (FILLER * 2)[:100]


def reply_text(turn: int) -> str:
    return f"reply to turn {turn}: " + (FILLER * 6)[:300]


def chat_graph() -> StateGraph:
    g = StateGraph(Chat)

    def reply(s: Chat) -> dict:
        turn = (len(s["messages"]) + 1) // 2
        return {"messages": [AIMessage(content=reply_text(turn))]}

    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    return g


# -- the savers ------------------------------------------------------------
def runkeep_binary() -> str:
    b = os.environ.get("RUNKEEP_BIN")
    if not b or not os.path.exists(b):
        raise SystemExit(f"bench: RUNKEEP_BIN must name a runkeep binary (got {b!r})")
    return b


class Server:
    """A `runkeep serve` on `store` with a worker token (like
    runkeep.testing.Serve, which starts only memory/fs stores)."""

    def __init__(self, store: str, workdir: Path, tenant: str = "bench") -> None:
        self.tenant = tenant
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNKEEP_") or k == "RUNKEEP_BIN"}
        env["NO_COLOR"] = "1"
        self.env = env
        tokens = str(self.dir / "tokens.json")
        out = subprocess.run(
            [runkeep_binary(), "--tenant", tenant, "--json", "token", "create", "--role", "worker", "--label", "saver-bench", "--tokens", tokens],
            env=env, capture_output=True, text=True, check=True,
        ).stdout
        self.token = json.loads(out)["token"]
        self.proc = subprocess.Popen(
            [runkeep_binary(), "--store", store, "--tenant", tenant, "--project", "langgraph", "--session", "threads", "serve", "--listen", "127.0.0.1:0", "--tokens", tokens, "--shutdown-grace", "2s"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.url = self._wait_url()
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=lambda s=stream: [None for _ in s], daemon=True).start()

    def _wait_url(self) -> str:
        deadline = time.monotonic() + 30
        out = ""
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read() if self.proc.stderr else ""
                    raise RuntimeError(f"runkeep serve exited ({self.proc.returncode}) before listening: {out}{err}")
                continue
            out += line
            m = re.search(r"listening on (http://[0-9.]+:\d+)", out)
            if m:
                return m.group(1)
        raise RuntimeError(f"runkeep serve printed no address within 30 s: {out}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@dataclass
class Saver:
    name: str
    sync: BaseCheckpointSaver
    open_async: Callable[[AsyncExitStack], Any] | None = None
    storage: Callable[[], dict[str, int]] | None = None  # bytes now
    baseline: dict[str, int] = field(default_factory=dict)


def pg_url(base: str, db: str) -> str:
    return re.sub(r"/[^/?]*(\?.*)?$", f"/{db}", base)


def recreate_db(admin_url: str, db: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')


def drop_db(admin_url: str, db: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def pg_tables_bytes(url: str, schema: str, like: str = "%") -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename, pg_total_relation_size((quote_ident(schemaname) || '.' || quote_ident(tablename))::regclass) FROM pg_tables WHERE schemaname = %s AND tablename LIKE %s",
            (schema, like),
        ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def dir_bytes(path: Path) -> dict[str, int]:
    apparent = allocated = files = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            st = os.lstat(os.path.join(root, n))
            apparent += st.st_size
            allocated += st.st_blocks * 512
            files += 1
    return {"apparent": apparent, "allocated": allocated, "files": files}


def open_savers(stack: ExitStack, args: argparse.Namespace, work: Path) -> list[Saver]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.sqlite import SqliteSaver
    from runkeep import RunkeepClient

    from langgraph.checkpoint.runkeep import RunkeepSaver

    admin = args.pg_url
    rk_db, lg_db = args.db, f"{args.db}_pgsaver"
    for db in (rk_db, lg_db):
        recreate_db(admin, db)
    if not args.keep:
        stack.callback(drop_db, admin, rk_db)
        stack.callback(drop_db, admin, lg_db)
    savers: list[Saver] = []

    # runkeep over HTTP on the directory store (fs: one session's runs/)
    fs_root = work / "runkeep-fs" / "data"
    srv = Server(f"fs:{fs_root}", work / "runkeep-fs")
    stack.callback(srv.close)
    client = RunkeepClient(srv.url, srv.token, tenant=srv.tenant)
    savers.append(Saver("runkeep-fs", RunkeepSaver(client), lambda st, c=client: RunkeepSaver(c), storage=lambda: dir_bytes(fs_root)))

    # runkeep over HTTP on PostgreSQL
    rk_url = pg_url(admin, rk_db)
    subprocess.run([runkeep_binary(), "--store", rk_url, "migrate"], env=srv.env, check=True, capture_output=True, text=True)
    srv_pg = Server(rk_url, work / "runkeep-pg")
    stack.callback(srv_pg.close)
    client_pg = RunkeepClient(srv_pg.url, srv_pg.token, tenant=srv_pg.tenant)

    def rk_pg_bytes() -> dict[str, int]:
        t = pg_tables_bytes(rk_url, "runkeep")
        return {"apparent": sum(t.values()), "tables": len(t)}

    savers.append(Saver("runkeep-pg", RunkeepSaver(client_pg), lambda st, c=client_pg: RunkeepSaver(c), storage=rk_pg_bytes))

    # PostgresSaver, its own database on the same server
    lg_url = pg_url(admin, lg_db)
    pgs = stack.enter_context(PostgresSaver.from_conn_string(lg_url))
    pgs.setup()

    async def open_apg(st: AsyncExitStack) -> Any:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        return await st.enter_async_context(AsyncPostgresSaver.from_conn_string(lg_url))

    def lg_bytes() -> dict[str, int]:
        t = pg_tables_bytes(lg_url, "public", "checkpoint%")
        return {"apparent": sum(t.values()), "tables": len(t)}

    savers.append(Saver("postgres", pgs, open_apg, storage=lg_bytes))

    # SqliteSaver on a file in the same directory as the directory store
    db_file = work / "sqlite" / "checkpoints.sqlite"
    db_file.parent.mkdir(parents=True)
    sq = stack.enter_context(SqliteSaver.from_conn_string(str(db_file)))
    sq.setup()

    async def open_asq(st: AsyncExitStack) -> Any:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        return await st.enter_async_context(AsyncSqliteSaver.from_conn_string(str(db_file)))

    def sq_bytes() -> dict[str, int]:
        c = sqlite3.connect(str(db_file))
        try:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            c.close()
        return dir_bytes(db_file.parent)

    savers.append(Saver("sqlite", sq, open_asq, storage=sq_bytes))

    mem = InMemorySaver()
    savers.append(Saver("memory", mem, lambda st, m=mem: m, storage=None))
    return savers


# -- measuring -------------------------------------------------------------
class Failed(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Failed(what)


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def rounds(rng: random.Random, savers: list[Saver]) -> list[Saver]:
    order = list(savers)
    rng.shuffle(order)
    return order


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000.0, out


def chat_phase(savers: list[Saver], T: int, tag: str, rng: random.Random) -> dict[str, list[float]]:
    graphs = {s.name: chat_graph().compile(checkpointer=s.sync) for s in savers}
    lat: dict[str, list[float]] = {s.name: [] for s in savers}
    for turn in range(1, T + 1):
        for s in rounds(rng, savers):
            ms, _ = timed(lambda: graphs[s.name].invoke({"messages": [HumanMessage(content=human(turn))]}, cfg(f"{tag}-chat")))
            lat[s.name].append(ms)
        if turn % 100 == 0:
            print(f"bench: chat turn {turn}: " + ", ".join(f"{n} {v[-1]:.1f} ms" for n, v in lat.items()), flush=True)
    return lat


def check_chat(saver: BaseCheckpointSaver, thread: str, T: int) -> None:
    """The chat thread's latest checkpoint holds all 2T messages, in order."""
    tup = saver.get_tuple(cfg(thread))
    check(tup is not None, f"{thread}: no checkpoint read back")
    msgs = tup.checkpoint["channel_values"].get("messages", [])
    check(len(msgs) == 2 * T, f"{thread}: {len(msgs)} messages read back, {2 * T} given")
    check(msgs[-2].content == human(T) and msgs[-1].content == reply_text(T), f"{thread}: the last turn's messages differ from those given")
    check(all(m.content == (human(i // 2 + 1) if i % 2 == 0 else reply_text(i // 2 + 1)) for i, m in enumerate(msgs)), f"{thread}: a message differs from the one given")


def invoke_phase(savers: list[Saver], N: int, tag: str, rng: random.Random) -> tuple[dict, dict]:
    graphs = {s.name: small_graph().compile(checkpointer=s.sync) for s in savers}
    fresh: dict[str, list[float]] = {s.name: [] for s in savers}
    one: dict[str, list[float]] = {s.name: [] for s in savers}
    for i in range(N):
        for s in rounds(rng, savers):
            ms, _ = timed(lambda: graphs[s.name].invoke({"n": 0, "last": ""}, cfg(f"{tag}-fresh-{i}")))
            fresh[s.name].append(ms)
    for i in range(N):
        for s in rounds(rng, savers):
            ms, _ = timed(lambda: graphs[s.name].invoke({"n": 0, "last": ""}, cfg(f"{tag}-one")))
            one[s.name].append(ms)
    return fresh, one


def check_small(saver: BaseCheckpointSaver, thread: str, invocations: int) -> None:
    tup = saver.get_tuple(cfg(thread))
    check(tup is not None, f"{thread}: no checkpoint read back")
    v = tup.checkpoint["channel_values"]
    check(v.get("n") == 3 * invocations and v.get("last") == f"c{3 * invocations}", f"{thread}: state {v} read back after {invocations} invocations (n={3 * invocations} given)")


async def invoke_async_phase(savers: list[Saver], N: int, tag: str, rng: random.Random) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    async with AsyncExitStack() as st:
        graphs = {}
        for s in savers:
            if s.open_async is None:
                continue
            a = s.open_async(st)
            if asyncio.iscoroutine(a):
                a = await a
            graphs[s.name] = (a, small_graph().compile(checkpointer=a))
            out[s.name] = []
        for _warm, (a, g) in graphs.items():
            await g.ainvoke({"n": 0, "last": ""}, cfg(f"{tag}-awarm"))
        names = list(graphs)
        for i in range(N):
            rng.shuffle(names)
            for name in names:
                t0 = time.perf_counter()
                await graphs[name][1].ainvoke({"n": 0, "last": ""}, cfg(f"{tag}-afresh-{i}"))
                out[name].append((time.perf_counter() - t0) * 1000.0)
        for name, (a, _g) in graphs.items():
            tup = await a.aget_tuple(cfg(f"{tag}-afresh-{N - 1}"))
            check(tup is not None and tup.checkpoint["channel_values"].get("n") == 3, f"{name} (async): the last fresh thread read back wrong")
    return out


class Putter:
    """Writes a chain of checkpoints to one thread of one saver, as the
    Pregel loop does: put, then put_writes of the step's task on it."""

    def __init__(self, saver: BaseCheckpointSaver, thread: str) -> None:
        self.saver, self.thread = saver, thread
        self.parent: str | None = None
        self.versions: dict[str, Any] = {}
        self.count = 0

    def step(self) -> None:
        i = self.count
        for ch in ("n", "last"):
            self.versions[ch] = self.saver.get_next_version(self.versions.get(ch), None)
        ckpt = {
            "v": 4,
            "id": str(uuid6(clock_seq=i)),
            "ts": datetime.now(timezone.utc).isoformat(),
            "channel_values": {"n": i, "last": f"step {i}"},
            "channel_versions": dict(self.versions),
            "versions_seen": {"node": dict(self.versions)},
            "updated_channels": ["n", "last"],
        }
        config = {"configurable": {"thread_id": self.thread, "checkpoint_ns": "", **({"checkpoint_id": self.parent} if self.parent else {})}}
        saved = self.saver.put(config, ckpt, {"source": "loop", "step": i, "parents": {}}, dict(self.versions))
        self.saver.put_writes(saved, [("n", 1), ("last", f"write {i}")], str(uuid.UUID(int=i + 1)))
        self.parent = ckpt["id"]
        self.count += 1


def check_puts(p: Putter, full_list: bool) -> None:
    tup = p.saver.get_tuple(cfg(p.thread))
    check(tup is not None, f"{p.thread}: no checkpoint read back")
    check(tup.checkpoint["id"] == p.parent, f"{p.thread}: latest {tup.checkpoint['id']} read back, {p.parent} written last")
    check(tup.checkpoint["channel_values"].get("n") == p.count - 1, f"{p.thread}: n={tup.checkpoint['channel_values'].get('n')} read back, {p.count - 1} given")
    check(sorted(w[1:] for w in tup.pending_writes) == [("last", f"write {p.count - 1}"), ("n", 1)], f"{p.thread}: pending writes {tup.pending_writes} read back")
    if full_list:
        n = sum(1 for _ in p.saver.list(cfg(p.thread)))
        check(n == p.count, f"{p.thread}: {n} checkpoints listed, {p.count} put")


def put_phase(savers: list[Saver], P: int, block: int, tag: str, rng: random.Random) -> tuple[dict[str, float], dict[str, Putter]]:
    putters = {s.name: Putter(s.sync, f"{tag}-puts") for s in savers}
    spent = {s.name: 0.0 for s in savers}
    while min(p.count for p in putters.values()) < P:
        for s in rounds(rng, savers):
            p = putters[s.name]
            k = min(block, P - p.count)
            t0 = time.perf_counter()
            for _ in range(k):
                p.step()
            spent[s.name] += time.perf_counter() - t0
    return {n: P / spent[n] for n in spent}, putters


def read_phase(savers: list[Saver], lengths: list[int], reads: int, tag: str, rng: random.Random) -> dict[int, dict[str, list[float]]]:
    putters = {s.name: Putter(s.sync, f"{tag}-reads") for s in savers}
    out: dict[int, dict[str, list[float]]] = {}
    for L in lengths:
        for s in savers:  # growth, not timed
            while putters[s.name].count < L:
                putters[s.name].step()
        out[L] = {s.name: [] for s in savers}
        got: dict[str, list[str]] = {s.name: [] for s in savers}
        for _ in range(reads):
            for s in rounds(rng, savers):
                ms, tup = timed(lambda: s.sync.get_tuple(cfg(f"{tag}-reads")))
                out[L][s.name].append(ms)
                got[s.name].append(tup.checkpoint["id"] if tup else None)
        for s in savers:
            check(all(g == putters[s.name].parent for g in got[s.name]), f"{s.name}: a read at length {L} answered another checkpoint than the latest")
    for p in putters.values():
        check_puts(p, full_list=False)
    return out


# -- reporting -------------------------------------------------------------
def ratio(x: float, base: float) -> str:
    return "—" if not base or x != x or base != base else f"{x / base:.2f}x"


def fmt(ms: float) -> str:
    return f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def window(lat: list[float], turn: int) -> float:
    T = len(lat)
    lo = max(0, min(turn - 5, T - 10))
    return statistics.median(lat[lo : lo + 10])


def report(res: dict, names: list[str], sizes: dict) -> str:
    T = sizes["turns"]
    mid = max(1, T // 2)
    L = []
    L.append(f"Savers: " + ", ".join(names) + f". Ratios are to `{BASELINE}` (PostgresSaver). Times in ms.\n")
    L.append(f"**(a) Per invocation** (3-node StateGraph, default durability, {sizes['invocations']} invocations)\n")
    L.append("| saver | fresh thread median | p90 | ratio | one thread median | p90 | ratio |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    fb, ob = statistics.median(res["fresh"][BASELINE]), statistics.median(res["one"][BASELINE])
    for n in names:
        f, o = res["fresh"][n], res["one"][n]
        L.append(f"| {n} | {fmt(statistics.median(f))} | {fmt(q(f, .9))} | {ratio(statistics.median(f), fb)} | {fmt(statistics.median(o))} | {fmt(q(o, .9))} | {ratio(statistics.median(o), ob)} |")
    if res.get("afresh"):
        ab = statistics.median(res["afresh"].get(BASELINE, [float("nan")]))
        for n in names:
            if n in res["afresh"]:
                f = res["afresh"][n]
                L.append(f"| {n} (async, `ainvoke`) | {fmt(statistics.median(f))} | {fmt(q(f, .9))} | {ratio(statistics.median(f), ab)} | | | |")
    L.append("")
    L.append(f"**(b) Chat thread** ({T} turns on one thread, `messages` with `add_messages`; median of 10 turns around each)\n")
    L.append(f"| saver | turn 1 | turn {mid} | turn {T} | turn {mid} / turn 1 | turn {mid} ratio |")
    L.append("|---|---:|---:|---:|---:|---:|")
    cb = window(res["chat"][BASELINE], mid)
    for n in names:
        c = res["chat"][n]
        t1, tm, tT = window(c, 1), window(c, mid), window(c, T)
        L.append(f"| {n} | {fmt(t1)} | {fmt(tm)} | {fmt(tT)} | {tm / t1:.2f} | {ratio(tm, cb)} |")
    L.append("")
    L.append(f"**(c) Put throughput** ({sizes['puts']} `put` + `put_writes` pairs on one thread, blocks of {sizes['block']} alternated)\n")
    L.append("| saver | pairs/s | ratio |")
    L.append("|---|---:|---:|")
    for n in names:
        L.append(f"| {n} | {res['puts'][n]:.0f} | {ratio(res['puts'][n], res['puts'][BASELINE])} |")
    L.append("")
    L.append(f"**(d) Latest read at length** (`get_tuple` of the latest checkpoint, {sizes['reads']} reads each; median ms (ratio))\n")
    Ls = sorted(res["reads"])
    L.append("| saver | " + " | ".join(f"{x} checkpoints" for x in Ls) + " |")
    L.append("|---|" + "---:|" * len(Ls))
    for n in names:
        cells = []
        for x in Ls:
            m = statistics.median(res["reads"][x][n])
            cells.append(f"{fmt(m)} ({ratio(m, statistics.median(res['reads'][x][BASELINE]))})")
        L.append(f"| {n} | " + " | ".join(cells) + " |")
    L.append("")
    L.append(f"**(e) Storage** of the chat thread after {T} turns (bytes above the empty store: directory = the files' sizes, PostgreSQL = `pg_total_relation_size` of the saver's tables, SQLite = the file after a WAL checkpoint)\n")
    L.append("| saver | bytes | per turn | ratio |")
    L.append("|---|---:|---:|---:|")
    sb = res["storage"].get(BASELINE)
    for n in names:
        b = res["storage"].get(n)
        if b is None:
            L.append(f"| {n} | — | — | — |")
        else:
            L.append(f"| {n} | {b:,} | {b // T:,} | {ratio(b, sb)} |")
    return "\n".join(L) + "\n"


def plot(chat: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    for n, lat in chat.items():
        xs = list(range(1, len(lat) + 1))
        line = ax.plot(xs, lat, alpha=0.18, linewidth=0.7)[0]
        smooth = [statistics.median(lat[max(0, i - 5) : i + 5]) for i in range(len(lat))]
        ax.plot(xs, smooth, color=line.get_color(), linewidth=1.8, label=n)
    ax.set_xlabel("turn")
    ax.set_ylabel("latency of one turn (ms; line = running median of 10)")
    ax.set_yscale("log")
    ax.set_title("LangGraph chat thread: per-turn latency by saver")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def update_doc(doc: Path, block: str) -> None:
    text = doc.read_text()
    begin, end = "<!-- saver-bench:begin -->", "<!-- saver-bench:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"bench: {doc} has no {begin} … {end} section to replace")
    a, b = text.index(begin) + len(begin), text.index(end)
    doc.write_text(text[:a] + "\n" + block + text[b:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=500, help="chat turns T (b, e)")
    ap.add_argument("--invocations", type=int, default=200, help="invocations N per kind (a)")
    ap.add_argument("--puts", type=int, default=1000, help="put+put_writes pairs (c)")
    ap.add_argument("--block", type=int, default=10, help="pairs per alternated block (c)")
    ap.add_argument("--lengths", default="10,1000,2000", help="thread lengths for latest reads (d)")
    ap.add_argument("--reads", type=int, default=50, help="reads per saver per length (d)")
    ap.add_argument("--no-async", action="store_true", help="skip the async rows of (a)")
    ap.add_argument("--pg-url", default=os.environ.get("RUNKEEP_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres"), help="an admin connection (CREATE/DROP DATABASE)")
    ap.add_argument("--db", default="runkeep_saver_bench", help="database for runkeep serve (dropped and recreated; NAME_pgsaver for PostgresSaver)")
    ap.add_argument("--dir", default=None, help="where the directory store and the SQLite file live (a fresh directory under it, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the databases and the directory")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--out", default=None, help="write the markdown tables here")
    ap.add_argument("--json-out", default=None, help="write every sample here")
    ap.add_argument("--plot", default=None, help="PNG of the chat thread's per-turn latency")
    ap.add_argument("--update-doc", default=None, help="replace the saver-bench section of this file (BENCHMARKS.md)")
    ap.add_argument("--label", default="", help="a line put above the tables in --update-doc (e.g. which server binary)")
    ap.add_argument("--command", default=None, help="the command line to quote in --update-doc")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    rng = random.Random(args.seed)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    commit += " (with uncommitted changes)" if dirty else ""
    tag = f"b{os.getpid()}"
    started = time.monotonic()
    parent = Path(args.dir) if args.dir else None
    if parent:
        parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="saver-bench-", dir=parent))
    res: dict[str, Any] = {}
    try:
        with ExitStack() as stack:
            if not args.keep:
                stack.callback(shutil.rmtree, work, True)
            savers = open_savers(stack, args, work)
            names = [s.name for s in savers]
            for s in savers:  # warm-up: connections, first requests
                small_graph().compile(checkpointer=s.sync).invoke({"n": 0, "last": ""}, cfg(f"{tag}-warm"))
            for s in savers:  # (e) counts what the chat thread adds to this
                if s.storage:
                    s.baseline = s.storage()
            print(f"bench: savers {names} ready in {time.monotonic() - started:.1f} s; chat, {args.turns} turns", flush=True)
            res["chat"] = chat_phase(savers, args.turns, tag, rng)
            for s in savers:
                check_chat(s.sync, f"{tag}-chat", args.turns)
            res["storage"] = {}
            res["storage_detail"] = {}
            for s in savers:
                if s.storage:
                    now = s.storage()
                    res["storage_detail"][s.name] = {"baseline": s.baseline, "after": now}
                    res["storage"][s.name] = now["apparent"] - s.baseline["apparent"]
            print(f"bench: per invocation, {args.invocations} x 2 ({time.monotonic() - started:.0f} s)", flush=True)
            res["fresh"], res["one"] = invoke_phase(savers, args.invocations, tag, rng)
            for s in savers:
                check_small(s.sync, f"{tag}-fresh-{args.invocations - 1}", 1)
                check_small(s.sync, f"{tag}-one", args.invocations)
            if not args.no_async:
                res["afresh"] = asyncio.run(invoke_async_phase(savers, args.invocations, tag, rng))
            print(f"bench: puts, {args.puts} ({time.monotonic() - started:.0f} s)", flush=True)
            res["puts"], putters = put_phase(savers, args.puts, args.block, tag, rng)
            for p in putters.values():
                check_puts(p, full_list=True)
            print(f"bench: latest reads at {lengths} ({time.monotonic() - started:.0f} s)", flush=True)
            res["reads"] = read_phase(savers, lengths, args.reads, tag, rng)
    except Failed as e:
        print(f"bench: FAILED: a saver did not store what it was given: {e}", file=sys.stderr)
        return 1
    took = time.monotonic() - started
    sizes = {"turns": args.turns, "invocations": args.invocations, "puts": args.puts, "block": args.block, "reads": args.reads}
    table = report(res, names, sizes)
    print(table)
    print(f"bench: every saver read back what it was given (chat messages, counters, checkpoint ids, pending writes); {took:.0f} s")
    if args.out:
        Path(args.out).write_text(table)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"sizes": sizes, "lengths": lengths, "seconds": took, **res}, indent=1, default=str))
    if args.plot:
        plot(res["chat"], Path(args.plot))
    if args.update_doc:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
        import psycopg

        with psycopg.connect(args.pg_url) as c:
            pgv = c.execute("SHOW server_version").fetchone()[0]
        head = [
            f"> {datetime.now(timezone.utc):%Y-%m-%d}, commit {commit}, {os.cpu_count()} cores ({cpu}), PostgreSQL {pgv}, {took / 60:.1f} min.",
            f"> Command: `{args.command or ' '.join(['python', *sys.argv])}`; server `{os.environ.get('RUNKEEP_BIN')}`; load average at the end {os.getloadavg()[0]:.1f}.",
        ]
        if args.label:
            head.append(f"> {args.label}")
        update_doc(Path(args.update_doc), "\n".join(head) + "\n\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
