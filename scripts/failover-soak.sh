#!/usr/bin/env bash
# The failover soak: `runkeep soak --chaos failover` over fresh PostgreSQL
# primary/standby pairs (scripts/pg-pair.sh), one failover per trial: while
# 8 workers drain, the primary is killed with kill -9 mid-transaction and
# the standby promoted. Prints, per trial and summed: acknowledged writes
# lost, fences issued twice, step commits answered outcome unknown (and how
# the read-back resolved them).
#
#   scripts/failover-soak.sh [sync|async] [TRIALS] [small|full]
#
# sync (the default): a gate. Every trial must pass (exit 1 otherwise).
# async: a measurement of what asynchronous replication costs; its trials
# may fail the audit, and the script still exits 0 once they all ran.
# small (CI, scripts/test.sh): 1 trial of 48 runs × 10 steps. full: 96
# runs × 30 steps each (README names it).
#
# Runs as root (the clusters run as postgres) or as postgres; needs
# PostgreSQL 15 (PGBIN) and a runkeep binary (RUNKEEP_BIN, default
# target/debug/runkeep).
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-sync}"
trials="${2:-1}"
size="${3:-small}"
RK="${RUNKEEP_BIN:-$PWD/target/debug/runkeep}"
[ -x "$RK" ] || { echo "failover-soak.sh: no runkeep binary at $RK (cargo build -p runkeep-cli, or set RUNKEEP_BIN)" >&2; exit 1; }
case "$size" in
    small) shape=(--runs 48 --steps 10 --failover-after 3s --timeout 3m) ;;
    full) shape=(--runs 96 --steps 30 --failover-after 15s --timeout 10m) ;;
    *) echo "failover-soak.sh: size must be small or full, not '$size'" >&2; exit 64 ;;
esac

work="$(mktemp -d /tmp/runkeep-failover-XXXXXX)"
chmod 755 "$work"
cleanup() {
    for d in "$work"/pair-*; do
        [ -d "$d" ] && bash scripts/pg-pair.sh stop "$d" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT

failed=0
printf '%-6s %-5s %-8s %-10s %-12s %-16s %-22s %s\n' trial mode verdict acks_lost fences_twice outcome_unknown "landed/not/unresolved" "open tx (commits in flight) at kill, promote ms"
sum_lost=0 sum_twice=0 sum_unknown=0
for t in $(seq 1 "$trials"); do
    pair="$work/pair-$t"
    bash scripts/pg-pair.sh up "$pair" "$mode" >"$work/pair-$t.log" 2>&1 \
        || { cat "$work/pair-$t.log" >&2; echo "failover-soak.sh: the pair did not come up" >&2; exit 1; }
    status=0
    "$RK" soak --chaos failover --pair "$pair" --workers 8 "${shape[@]}" \
        --json --dir "$work/soak-$t" >"$work/report-$t.json" 2>"$work/soak-$t.stderr" || status=$?
    # Stopped, kept until the verdict: a failed trial keeps its clusters'
    # data (the store the audit read) for inspection.
    bash scripts/pg-pair.sh stop "$pair" >/dev/null 2>&1 || true
    if [ ! -s "$work/report-$t.json" ]; then
        cat "$work/soak-$t.stderr" >&2
        echo "failover-soak.sh: trial $t: the soak wrote no report (exit $status)" >&2
        exit 1
    fi
    line="$(python3 - "$work/report-$t.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
a = r["audit"]
rb = r.get("read_backs") or {}
f = r.get("failover") or {}
v = "pass" if not a["violations"] and r["finished_in_time"] else ("FAIL" if a["violations"] else "timeout")
# The interleaving the trial is about: no failover, or (sync) no commit in
# flight at the kill, proves nothing.
if not f:
    v = "NO-FAILOVER"
elif f["replication"] == "sync" and f["commits_in_flight"] < 1:
    v = "NOT-MID-COMMIT"
u = rb.get("outcome_unknown", 0)
landed, not_landed = rb.get("landed", 0), rb.get("not_landed", 0)
print(v, a["acks_lost"], a["fences_issued_twice"], u,
      f"{landed}/{not_landed}/{max(0, u - landed - not_landed)}",
      f"{f.get('open_transactions', '-')}({f.get('commits_in_flight', '-')}),{f.get('promote_ms', '-')}")
EOF
)"
    read -r verdict lost twice unknown resolved kill <<<"$line"
    printf '%-6s %-5s %-8s %-10s %-12s %-16s %-22s %s\n' "$t" "$mode" "$verdict" "$lost" "$twice" "$unknown" "$resolved" "$kill"
    sum_lost=$((sum_lost + lost)); sum_twice=$((sum_twice + twice)); sum_unknown=$((sum_unknown + unknown))
    if [ "$status" = 0 ] && [ "$verdict" = pass ]; then
        bash scripts/pg-pair.sh down "$pair" >/dev/null 2>&1 || true
    else
        failed=$((failed + 1))
        echo "--- trial $t: the pair's data (stopped) is kept in $pair" >&2
        echo "--- trial $t: soak exit $status; its report (text) follows" >&2
        python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("\n".join(r["audit"]["violations"][:20]))' "$work/report-$t.json" >&2
        tail -5 "$work/soak-$t.stderr" >&2
    fi
done
echo "failover-soak.sh: $mode, $trials trial(s), $size: $sum_lost acknowledged writes lost, $sum_twice fences issued twice, $sum_unknown outcome-unknown commits; $failed trial(s) failed"
trap - EXIT
cleanup
if [ "$failed" = 0 ]; then
    rm -rf "$work"
else
    echo "failover-soak.sh: reports and soak directories kept in $work" >&2
fi
if [ "$mode" = sync ] && [ "$failed" != 0 ]; then
    exit 1
fi
