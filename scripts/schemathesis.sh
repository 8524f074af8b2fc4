#!/usr/bin/env bash
# Schemathesis against a live `runkeep serve`: the OpenAPI document
# (crates/runkeep-http/openapi.json, as the server serves it) against what
# the server does. Fails on any 5xx, any answer that breaks the document
# (status code, content type, body schema) and any request the document
# calls valid that the server refuses ("valid request rejected").
#
# - schemathesis is pinned with every dependency in
#   scripts/schemathesis-requirements.txt and installed into a venv under
#   target/schemathesis/venv, reused until that file (or the Python) changes.
# - The server is this repository's `runkeep` (RUNKEEP_BIN, else
#   target/debug/runkeep built now) over a fresh directory store under
#   target/schemathesis/, with a reader, a worker and an operator token of
#   tenant `acme`, and a few runs seeded (queued, held, parked, finished) so
#   the per-run routes reach real state.
# - One schemathesis run per token, in that order, each bounded by
#   SCHEMATHESIS_MAX_TIME seconds (default 10); hooks in
#   scripts/schemathesis_hooks.py shorten long-poll waits and leave out what
#   no document can state (opaque cursors, `session` without `project`).
#
# `scripts/test.sh` calls this. Run it alone: `bash scripts/schemathesis.sh`.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

python="${PYTHON:-python3}"
max_time="${SCHEMATHESIS_MAX_TIME:-10}"
req="scripts/schemathesis-requirements.txt"
base="$repo/target/schemathesis"
venv="$base/venv"
mkdir -p "$base"

if ! command -v "$python" >/dev/null 2>&1; then
    echo "schemathesis.sh: $python is required (CPython 3.11 with venv and pip)" >&2
    exit 1
fi
want="$(sha256sum "$req" | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0])')"
# A venv moved from elsewhere (its scripts name the old interpreter path)
# is rebuilt too.
if [ ! -x "$venv/bin/st" ] || [ "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ] \
    || ! "$venv/bin/st" --version >/dev/null 2>&1; then
    echo "schemathesis.sh: installing $req into $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    PIP_CACHE_DIR="$base/pip-cache" "$venv/bin/pip" install --quiet --disable-pip-version-check \
        --no-deps --requirement "$req"
    "$venv/bin/pip" check --disable-pip-version-check
    echo "$want" >"$venv/.requirements"
fi
# scripts/prepare.sh stops here: the venv is all it wants.
if [ -n "${RUNKEEP_PREPARE_ONLY:-}" ]; then exit 0; fi
echo "schemathesis.sh: $("$venv/bin/st" --version)"

if [ -z "${RUNKEEP_BIN:-}" ]; then
    cargo build --quiet -p runkeep-cli --bin runkeep --all-features
    RUNKEEP_BIN="$repo/target/debug/runkeep"
fi

work="$(mktemp -d "$base/run.XXXXXX")"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    # The server's log, for a failure's reproduction.
    cp "$work/serve.err" "$base/serve.log" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The runkeep variables of the caller's environment would change the store,
# tenant or tokens of the commands below.
unset RUNKEEP_STORE RUNKEEP_TENANT RUNKEEP_PROJECT RUNKEEP_SESSION RUNKEEP_TOKENS RUNKEEP_TOKEN RUNKEEP_LOG

tenant=acme
declare -A token
for role in reader worker operator; do
    token[$role]="$("$RUNKEEP_BIN" --tenant "$tenant" --json token create --role "$role" \
        --label schemathesis --tokens "$work/tokens.json" \
        | "$python" -c 'import json, sys; print(json.load(sys.stdin)["token"])')"
done

"$RUNKEEP_BIN" --store "root:$work/data" --tenant "$tenant" serve --listen 127.0.0.1:0 \
    --tokens "$work/tokens.json" --shutdown-grace 2s >"$work/serve.out" 2>"$work/serve.err" &
server_pid=$!
url=""
for _ in $(seq 1 200); do
    url="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/serve.out" | head -n1 || true)"
    [ -n "$url" ] && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
if [ -z "$url" ]; then
    echo "schemathesis.sh: runkeep serve did not start" >&2
    cat "$work/serve.out" "$work/serve.err" >&2
    exit 1
fi
echo "schemathesis.sh: runkeep serve at $url"

# Seeds: a few runs in project p, session s, so the per-run routes find real
# state. `call ROLE METHOD PATH [BODY]` fails on any answer but 2xx.
run_path="$url/v1/tenants/$tenant/projects/p/sessions/s/runs"
call() {
    local role=$1 method=$2 path=$3 body=${4:-}
    local args=(-sS --fail-with-body -X "$method" -H "Authorization: Bearer ${token[$role]}")
    if [ -n "$body" ]; then
        args+=(-H 'Content-Type: application/json' --data "$body")
    fi
    curl "${args[@]}" "$run_path/$path" >"$work/last.json" || {
        echo "schemathesis.sh: seeding failed: $method $path: $(cat "$work/last.json")" >&2
        exit 1
    }
}
now="$(date +%s%3N)"
checkpoint() { # id [pending]
    printf '{"id":"%s","createdAt":%s,"state":{"step":1}%s}' "$1" "$now" "${2:-}"
}
for i in 0 1 2 3 4; do
    call operator POST "run_$i/enqueue" "{\"checkpoint\":$(checkpoint cp-0)}"
done
# run_1: held by the worker token, with events, a checkpoint, messages, a record.
call worker POST run_1/claim '{"holder":"seed","ttlMs":3600000}'
call worker POST run_1/steps "{\"fence\":1,\"step\":{\"events\":[{\"type\":\"note\",\"payload\":{\"n\":1}}],\"checkpoint\":$(checkpoint cp-1),\"messages\":{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]},\"runRecord\":{\"status\":\"running\"}}}"
call worker POST run_1/audit '{"fence":1,"events":[{"who":"seed","what":"start","outcome":"ok"}]}'
# run_2: parked on cp-park, released.
call worker POST run_2/claim '{"holder":"seed","ttlMs":3600000}'
call worker POST run_2/steps "{\"fence\":1,\"step\":{\"events\":[{\"type\":\"ask\",\"payload\":{}}],\"checkpoint\":$(checkpoint cp-park ",\"pending\":{\"request\":{\"type\":\"approval\"},\"parkedAt\":$now}")}}"
call worker POST run_2/release '{"fence":1}'
# run_3: finished.
call worker POST run_3/claim '{"holder":"seed","ttlMs":3600000}'
call worker POST run_3/finish '{"fence":1,"outcome":{"status":"completed","result":{"ok":true}}}'
# run_4: held by the operator token (a holding the worker token did not
# claim), parked on cp-park too.
call operator POST run_4/claim '{"holder":"seed-operator","ttlMs":3600000}'
call operator POST run_4/steps "{\"fence\":1,\"step\":{\"checkpoint\":$(checkpoint cp-park ",\"pending\":{\"request\":{\"type\":\"approval\"},\"parkedAt\":$now}")}}"

cat >"$work/schemathesis.toml" <<EOF
workers = 1
request-timeout = 10
cache = { enabled = false }
max-time = $max_time
continue-on-failure = true
suppress-health-check = ["too_slow", "filter_too_much"]

[generation]
max-examples = 25
database = "none"

[checks]
enabled = false
not_a_server_error.enabled = true
status_code_conformance.enabled = true
content_type_conformance.enabled = true
response_schema_conformance.enabled = true
positive_data_acceptance.enabled = true

[parameters]
"path.tenant" = "$tenant"
"path.project" = { dictionary = "projects", probability = 0.8 }
"path.session" = { dictionary = "sessions", probability = 0.8 }
"path.run" = { dictionary = "runs", probability = 0.8 }
"path.checkpoint" = { dictionary = "checkpoints", probability = 0.8 }
# Fences the seeded runs hold (a fence never issued is refused by the store).
"body.fence" = { dictionary = "fences", probability = 0.7 }
"query.fence" = { dictionary = "fences", probability = 0.7 }

[dictionaries]
projects = { values = ["p"] }
sessions = { values = ["s"] }
runs = { values = ["run_0", "run_1", "run_2", "run_3", "run_4"] }
checkpoints = { values = ["cp-0", "cp-1", "cp-park"] }
fences = { values = [1, 2, 3] }

# The live tail never ends by itself: read it for a second.
[[operations]]
include-operation-id = "tail_events"
request-timeout = 1
EOF

status=0
passed=0
failed=0
for role in reader worker operator; do
    echo "schemathesis.sh: --- $role token ---"
    started=$(date +%s)
    rc=0
    # From the run's directory: schemathesis and hypothesis keep their state
    # (.schemathesis/, .hypothesis/) in the working directory.
    (cd "$work" && SCHEMATHESIS_HOOKS="$repo/scripts/schemathesis_hooks.py" "$venv/bin/st" \
        --config-file "$work/schemathesis.toml" run "$url/openapi.json" \
        --url "$url" \
        --header "Authorization: Bearer ${token[$role]}" \
        --no-color \
        --report junit --report-dir "$base/report-$role") \
        || rc=$?
    echo "schemathesis.sh: $role: exit $rc after $(($(date +%s) - started)) s"
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        status=1
    fi
done
if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "schemathesis.sh: runkeep serve died during the run" >&2
    cat "$work/serve.err" >&2
    status=1
    failed=$((failed + 1))
fi
if [ "$status" -ne 0 ]; then
    echo "schemathesis.sh: FAILED (the reports are in $base/report-*, the server's log in $base/serve.log)" >&2
fi
# One line per token run, in the form CI reads.
echo "schemathesis: $passed passed, $failed failed"
exit "$status"
