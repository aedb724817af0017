#!/usr/bin/env bash
# Records a PostgreSQL primary's WAL under one of the bench's loads, for codec profiling with
# `harness/examples/codec_profile.rs` (one core, no relay, no network):
#
#   scripts/record-wal.sh WORKLOAD OUT.wal [SECONDS]
#   target/release/examples/codec_profile OUT.wal "$(cat OUT.wal.lsn)" 15 decode
#
# WORKLOAD: pgbench (TPC-B, scale 10, 4 clients), bulk (batches of 20,000 md5 rows by
# INSERT ... SELECT and by COPY in turn for 13 s, then two CREATE INDEX and TRUNCATE, in
# cycles: the bench's `bulk`),
# pgbench-pglz, pgbench-lz4, pgbench-zstd (pgbench with the primary's `wal_compression`),
# updates (300k rows of md5 text, two random rows updated per transaction, 4 clients),
# moves (40k wide rows of md5 text on full pages, one small column updated: the rows move),
# toast (20,000 documents of ~6.6 kB of md5 hex stored out of line; each transaction
# overwrites 32 characters of a random one, which TOAST writes whole again).
# SECONDS (default 60) of load; checkpoints at the bench's pace (checkpoint_timeout = 30s;
# CHECKPOINT_TIMEOUT=5min for PostgreSQL's default, as `walrelay bench --checkpoint-timeout`),
# never forced (`wal_keep_size` keeps every segment for the copy). OUT.wal is the segment
# files from the one holding the load's start to the last complete one, concatenated;
# OUT.wal.lsn holds the first segment's start LSN (X/Y). RATE=N runs pgbench at N
# transactions per second (`-R`; a bench run's primary, sharing two cores with its standbys
# and relays, manages 2,000-3,000): fewer records per checkpoint cycle, so a larger share
# of the WAL is full-page images.
# PostgreSQL from $PG_BIN, else /usr/lib/postgresql/15/bin. As root, the server runs as
# `postgres`. Everything else lives in a temporary directory that is removed at the end.
set -euo pipefail

die() { echo "record-wal: error: $*" >&2; exit 1; }
[[ $# -ge 2 ]] || die "usage: record-wal.sh WORKLOAD OUT.wal [SECONDS]"
workload=$1 out=$2 secs=${3:-60}
bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
[[ -x $bin/postgres ]] || die "no PostgreSQL server in $bin: set PG_BIN or run scripts/install-deps.sh"
case $workload in
    pgbench | bulk | updates | moves | toast) compression=off ;;
    pgbench-pglz | pgbench-lz4 | pgbench-zstd) compression=${workload#pgbench-} ;;
    *) die "unknown workload '$workload' (pgbench, bulk, updates, moves, toast, pgbench-pglz, pgbench-lz4, pgbench-zstd)" ;;
esac

dir=$(mktemp -d)
chmod 755 "$dir"
as_pg=()
if [[ $(id -u) == 0 ]]; then
    chown postgres "$dir"
    as_pg=(runuser -u postgres --)
fi
port=$((20000 + RANDOM % 20000))
cleanup() {
    "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" stop -m immediate >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

"${as_pg[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >>"$dir/data/postgresql.conf" <<EOF
port = $port
listen_addresses = ''
unix_socket_directories = '$dir'
checkpoint_timeout = ${CHECKPOINT_TIMEOUT:-30s}
max_wal_size = 4GB
wal_keep_size = 64GB
fsync = off
wal_compression = $compression
EOF
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w start >/dev/null
psql=("${as_pg[@]}" "$bin/psql" -h "$dir" -p "$port" -U postgres -qAtX -v ON_ERROR_STOP=1 postgres)
pgbench=("${as_pg[@]}" "$bin/pgbench" -h "$dir" -p "$port" -U postgres)

# The bench's tables (harness/src/bench/workloads.rs, `prepare`).
case $workload in
    bulk) "${psql[@]}" -c "create table bulk (id bigint, k text, v text)" ;;
    updates)
        "${psql[@]}" -c "create table updates (id int primary key, payload text)" \
            -c "insert into updates select g, md5(random()::text) from generate_series(1, 300000) g" \
            -c "vacuum analyze updates"
        ;;
    moves)
        "${psql[@]}" -c "create table movers (id int primary key, n int not null default 0, payload text) with (fillfactor = 100)" \
            -c "insert into movers select g, 0, (select string_agg(md5(random()::text || i), '') from generate_series(1, 12 + 0 * g) i) from generate_series(1, 40000) g" \
            -c "vacuum analyze movers"
        ;;
    toast)
        "${psql[@]}" -c "create table docs (id int primary key, n int not null default 0, body text)" \
            -c "alter table docs alter column body set storage external" \
            -c "insert into docs select g, 0, (select string_agg(md5(random()::text || i), ' ') from generate_series(1, 200 + 0 * g) i) from generate_series(1, 20000) g" \
            -c "vacuum analyze docs"
        ;;
    *) "${pgbench[@]}" -i -s 10 -q postgres >/dev/null 2>&1 ;;
esac
# The load starts in a fresh segment right after a checkpoint, as the bench's does (its
# standbys' base backups checkpoint): every block's first change is a full-page image.
"${psql[@]}" -c "checkpoint" -c "select pg_switch_wal()" >/dev/null
start_seg=$("${psql[@]}" -c "select pg_walfile_name(pg_current_wal_insert_lsn())")
start_lsn=$(printf "%X/%X" "0x${start_seg:8:8}" "$((0x${start_seg:16:8} * 16777216))")

if [[ $workload == bulk ]]; then
    end=$((SECONDS + secs)) n=0
    while ((SECONDS < end)); do
        cycle=$((SECONDS + 13))
        while ((SECONDS < cycle && SECONDS < end)); do
            rows="select g, md5(g::text), repeat(md5(random()::text), 4) from generate_series($n, $((n + 19999))) g"
            if (((n / 20000) % 2 == 0)); then
                "${psql[@]}" -c "insert into bulk $rows"
            else
                "${psql[@]}" -c "copy ($rows) to stdout" | "${psql[@]}" -c "copy bulk from stdin"
            fi
            n=$((n + 20000))
        done
        ((SECONDS < end)) || break
        "${psql[@]}" -c "create index bulk_k on bulk (k)" -c "create index bulk_v on bulk (v)" \
            -c "drop index bulk_k" -c "drop index bulk_v" -c "truncate bulk"
    done
elif [[ $workload == updates || $workload == moves || $workload == toast ]]; then
    script=$dir/$workload.sql
    if [[ $workload == updates ]]; then
        printf '%s\n' '\set id1 random(1, 300000)' '\set id2 random(1, 300000)' 'begin;' \
            'update updates set payload = md5(random()::text) where id = :id1;' \
            'update updates set payload = md5(random()::text) where id = :id2;' 'end;' >"$script"
    elif [[ $workload == moves ]]; then
        printf '%s\n' '\set id random(1, 40000)' 'update movers set n = n + 1 where id = :id;' >"$script"
    else
        printf '%s\n' '\set id random(1, 20000)' \
            'update docs set n = n + 1, body = overlay(body placing md5(random()::text) from 1 + (random() * 6000)::int for 32) where id = :id;' >"$script"
    fi
    chmod 644 "$script"
    "${pgbench[@]}" -n -j 2 -c 4 ${RATE:+-R "$RATE"} -T "$secs" -f "$script" postgres >/dev/null 2>&1
else
    "${pgbench[@]}" -j 2 -c 4 ${RATE:+-R "$RATE"} -T "$secs" postgres >/dev/null 2>&1
fi
# Close the last segment so every copied file is complete.
"${psql[@]}" -c "select pg_switch_wal()" >/dev/null
end_seg=$("${psql[@]}" -c "select pg_walfile_name(pg_current_wal_insert_lsn())")
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" stop -m fast >/dev/null

: >"$out"
for f in $(ls "$dir/data/pg_wal" | grep -E '^[0-9A-F]{24}$' | sort); do
    [[ $f < $start_seg || ! $f < $end_seg ]] && continue
    cat "$dir/data/pg_wal/$f" >>"$out"
done
echo "$start_lsn" >"$out.lsn"
echo "record-wal: $workload: $(($(stat -c %s "$out") >> 20)) MiB of WAL from $start_lsn in $out"
