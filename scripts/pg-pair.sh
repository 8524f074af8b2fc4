#!/usr/bin/env bash
# A PostgreSQL 15 primary/standby pair on loopback, for the failover soak
# (`runkeep soak --chaos failover --pair DIR`) and the doctor's replication
# check. Run as root (the clusters run as the `postgres` user) or as
# postgres.
#
#   scripts/pg-pair.sh up DIR sync|async   create and start a fresh pair in DIR
#   scripts/pg-pair.sh stop DIR            stop both clusters (immediate), keep DIR
#   scripts/pg-pair.sh down DIR            stop both clusters (immediate) and
#                                          remove DIR
#
# `up` picks two free loopback ports, initdb's the primary, creates the
# database `rk`, takes a base backup into the standby (streaming, slotless,
# application_name standby1) and starts it. With `sync` it then sets
# synchronous_standby_names = 'standby1' and synchronous_commit = on, and
# waits until pg_stat_replication shows the standby `sync` (set before the
# standby streams, the CREATE DATABASE above would wait forever for an
# acknowledgement nobody sends). With `async` it waits for `async`.
#
# It writes DIR/pair.env (KEY=value lines the soak reads; also sourceable):
#   PAIR_MODE, PAIR_PRIMARY_PORT, PAIR_STANDBY_PORT, PAIR_PRIMARY_DATA,
#   PAIR_STANDBY_DATA, PAIR_URL (the multi-host URL workers use).
set -euo pipefail

PGBIN="${PGBIN:-/usr/lib/postgresql/15/bin}"

die() { echo "pg-pair.sh: $*" >&2; exit 1; }

as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

psql_at() {
    local port=$1
    shift
    as_pg "$PGBIN/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"
}

# Waits (bounded) until `psql_at PORT -c SQL` prints WANT.
wait_for() {
    local port=$1 sql=$2 want=$3 i got=""
    for i in $(seq 1 200); do
        got="$(psql_at "$port" -c "$sql" 2>/dev/null || true)"
        [ "$got" = "$want" ] && return 0
        sleep 0.1
    done
    die "waited 20 s for '$sql' on port $port to answer '$want'; it answered '$got'"
}

up() {
    local dir=$1 mode=$2
    [ -x "$PGBIN/initdb" ] || die "no PostgreSQL 15 at $PGBIN (apt-get install postgresql-15, or set PGBIN)"
    case "$mode" in sync | async) ;; *) die "mode must be sync or async, not '$mode'" ;; esac
    [ -e "$dir/pair.env" ] && die "$dir already holds a pair ($dir/pair.env); run: $0 down $dir"
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
    local p s
    p="$(free_port)"
    s="$(free_port)"
    while [ "$s" = "$p" ]; do s="$(free_port)"; done

    as_pg "$PGBIN/initdb" -D "$dir/primary" -U postgres --auth=trust >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
    cat >>"$dir/primary/postgresql.conf" <<EOF
port = $p
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 5
# A standby retries its WAL sources this often (default 5 s); a promotion
# waits out the current pause, so the default makes every failover last 5 s.
wal_retrieve_retry_interval = '200ms'
max_connections = 100
shared_buffers = 32MB
fsync = on
EOF
    as_pg tee "$dir/primary/pg_hba.conf" >/dev/null <<'EOF'
local all all trust
host all all 127.0.0.1/32 trust
local replication all trust
host replication all 127.0.0.1/32 trust
EOF
    as_pg "$PGBIN/pg_ctl" -D "$dir/primary" -l "$dir/primary.log" -w start >/dev/null
    psql_at "$p" -c "CREATE DATABASE rk"
    as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$p" -U postgres -D "$dir/standby" -R -X stream -c fast
    as_pg sed -i "s/^port = $p\$/port = $s/" "$dir/standby/postgresql.conf"
    as_pg sed -i "s/^primary_conninfo = '/primary_conninfo = 'application_name=standby1 /" \
        "$dir/standby/postgresql.auto.conf"
    as_pg "$PGBIN/pg_ctl" -D "$dir/standby" -l "$dir/standby.log" -w start >/dev/null
    wait_for "$p" "select state from pg_stat_replication where application_name = 'standby1'" streaming
    if [ "$mode" = sync ]; then
        psql_at "$p" -c "ALTER SYSTEM SET synchronous_standby_names = 'standby1'" \
            -c "ALTER SYSTEM SET synchronous_commit = on" -c "SELECT pg_reload_conf()" >/dev/null
    fi
    wait_for "$p" "select sync_state from pg_stat_replication where application_name = 'standby1'" "$mode"

    local env_tmp="$dir/pair.env.tmp"
    cat >"$env_tmp" <<EOF
PAIR_MODE=$mode
PAIR_PRIMARY_PORT=$p
PAIR_STANDBY_PORT=$s
PAIR_PRIMARY_DATA=$dir/primary
PAIR_STANDBY_DATA=$dir/standby
PAIR_URL=postgres://postgres@127.0.0.1:$p,127.0.0.1:$s/rk?target_session_attrs=read-write
EOF
    mv "$env_tmp" "$dir/pair.env"
    echo "pg-pair.sh: $mode pair up in $dir: primary 127.0.0.1:$p, standby 127.0.0.1:$s"
    grep '^PAIR_URL=' "$dir/pair.env"
}

# Stops both clusters (immediate), keeping DIR: what a failed trial leaves
# to inspect (start the promoted standby again with pg_ctl -D DIR/standby).
stop() {
    local dir=$1 d
    for d in primary standby; do
        if [ -f "$dir/$d/postmaster.pid" ]; then
            as_pg "$PGBIN/pg_ctl" -D "$dir/$d" -m immediate -w stop >/dev/null 2>&1 || true
        fi
    done
}

down() {
    local dir=$1 d
    for d in primary standby; do
        if [ -f "$dir/$d/postmaster.pid" ]; then
            as_pg "$PGBIN/pg_ctl" -D "$dir/$d" -m immediate -w stop >/dev/null 2>&1 || true
        fi
        # A postmaster killed with kill -9 leaves its backends to exit on
        # their own; pg_ctl no longer finds it.
    done
    rm -rf "$dir"
}

case "${1:-}" in
    up) [ $# = 3 ] || die "usage: $0 up DIR sync|async"; up "$2" "$3" ;;
    stop) [ $# = 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
    down) [ $# = 2 ] || die "usage: $0 down DIR"; down "$2" ;;
    *) die "usage: $0 up DIR sync|async | $0 stop DIR | $0 down DIR" ;;
esac
