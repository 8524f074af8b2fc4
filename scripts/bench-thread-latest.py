#!/usr/bin/env python3
"""Latest thread checkpoint read (`GET {run}/thread/checkpoint`) at several
thread lengths, through `runkeep serve` (issue 29 item 1).

    python3 scripts/bench-thread-latest.py BIN STORE [N ...]

BIN: a `runkeep` binary; STORE: `fs` (a fresh directory) or a
`postgres://` URL. Writes a thread of N checkpoints (3 channels, each put
changing one, ~1 KiB values) per N, then times 200 latest reads and prints
the median and p95 in ms. Standard library only."""
import json, os, re, statistics, subprocess, sys, tempfile, time, urllib.request, uuid

binary, store = sys.argv[1], sys.argv[2]
sizes = [int(n) for n in sys.argv[3:]] or [10, 1000, 2000]
tmp = tempfile.mkdtemp(prefix="rk-bench-")
store_arg = f"fs:{tmp}/data" if store == "fs" else store
store_args = ["--store", store_arg]
if store != "fs":
    # A schema of its own, migrated now (dropped by hand afterwards).
    store_args += ["--pg-schema", "rk_bench_" + uuid.uuid4().hex[:8]]
    subprocess.run([binary, *store_args, "migrate"], capture_output=True, check=True)
tokens = os.path.join(tmp, "tokens.json")
tok = json.loads(subprocess.run([binary, "--tenant", "acme", "--json", "token", "create", "--role", "operator",
                                 "--label", "bench", "--tokens", tokens], capture_output=True, text=True, check=True).stdout)["token"]
proc = subprocess.Popen([binary, *store_args, "--tenant", "acme", "--project", "proj", "--session", "sess",
                         "serve", "--listen", "127.0.0.1:0", "--tokens", tokens], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
url = None
for line in proc.stdout:
    m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
    if m:
        url = m.group(1)
        break
assert url, "no address"


def call(method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {tok}", "content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


try:
    for n in sizes:
        run = "bench" + uuid.uuid4().hex[:12]
        base = f"/v1/tenants/acme/projects/proj/sessions/sess/runs/{run}"
        versions = {"a": 0, "b": 0, "c": 0}
        t0 = time.perf_counter()
        put_ms = []
        for i in range(1, n + 1):
            ch = "abc"[i % 3]
            versions[ch] = i
            cid = f"1ef{i:08d}"
            body = {"thread": run, "ns": "", "checkpointId": cid, "parentId": f"1ef{i-1:08d}" if i > 1 else None,
                    "checkpoint": {"v": 4, "id": cid, "channel_versions": {k: str(v) for k, v in versions.items()}},
                    "metadata": {"step": i, "source": "loop"},
                    "blobs": [{"channel": ch, "version": str(i), "type": "json", "data": "x" * 1024}]}
            if body["parentId"] is None:
                del body["parentId"]
            s = time.perf_counter()
            call("PUT", base + "/thread/checkpoints", body)
            put_ms.append((time.perf_counter() - s) * 1000)
        reads = []
        for _ in range(200):
            s = time.perf_counter()
            got = call("GET", base + "/thread/checkpoint")
            reads.append((time.perf_counter() - s) * 1000)
        assert got["checkpoint"]["checkpointId"] == f"1ef{n:08d}", got
        assert len(got["checkpoint"]["values"]) == min(n, 3), got["checkpoint"]["values"]
        last_puts = put_ms[-min(50, n):]
        print(f"{store.split(':')[0]} n={n}: latest GET median {statistics.median(reads):.2f} ms, "
              f"p95 {sorted(reads)[int(len(reads) * 0.95)]:.2f} ms; put (last {len(last_puts)}) median {statistics.median(last_puts):.2f} ms",
              flush=True)
finally:
    proc.kill()
