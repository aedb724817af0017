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
#
# REPLAY=1 also measures how fast PostgreSQL itself replays the same WAL: a base backup is
# taken just before the load (`pg_basebackup`, its own fast checkpoint), and afterwards a
# server at default settings recovers it from an archive of the recorded segments
# (`restore_command`, `recovery.signal`: to the archive's end, then promoted) with all its
# processes on one core (`taskset -c ${REPLAY_CPU:-1}`). It prints the startup process's own
# figures from its log line "redo done at ... system usage: CPU: user ..., elapsed ..."
# (PostgreSQL 15 and later): the WAL's MB from the backup's start to the redo's end, per
# second of the startup process's CPU and per second elapsed. That is the rate at which a
# standby applies this WAL on one core, the reference for the relay's one-core encode and
# decode (`codec_profile` on OUT.wal, whose first segment holds the backup's start).
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
    for d in data base; do
        [[ -f $dir/$d/postmaster.pid ]] && "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/$d" stop -m immediate >/dev/null 2>&1 || true
    done
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
if [[ ${REPLAY:-0} == 1 ]]; then
    "${as_pg[@]}" "$bin/pg_basebackup" -h "$dir" -p "$port" -U postgres -D "$dir/base" -X fetch -c fast
fi

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
[[ ${REPLAY:-0} == 1 ]] || exit 0

# The standby's replay: the recorded segments as its archive, PostgreSQL's defaults in
# place of the primary's settings above (the base backup copied its postgresql.conf).
mkdir "$dir/archive"
for f in $(ls "$dir/data/pg_wal" | grep -E '^[0-9A-F]{24}$' | sort); do
    [[ $f < $start_seg || ! $f < $end_seg ]] || cp "$dir/data/pg_wal/$f" "$dir/archive/"
done
chmod -R a+rX "$dir/archive"
rm -rf "$dir/data"
printf '%s\n' "port = $port" "listen_addresses = ''" "unix_socket_directories = '$dir'" \
    "checkpoint_timeout = 5min" "max_wal_size = 1GB" "wal_keep_size = 0" "fsync = on" \
    "restore_command = 'cp $dir/archive/%f %p'" >>"$dir/base/postgresql.conf"
"${as_pg[@]}" touch "$dir/base/recovery.signal"
"${as_pg[@]}" taskset -c "${REPLAY_CPU:-1}" "$bin/pg_ctl" -D "$dir/base" -l "$dir/replay.log" -w -t 3600 start >/dev/null
# pg_ctl returns once hot standby accepts connections, before the redo's end.
for ((i = 0; i < 36000; i++)); do
    grep -q "redo done at" "$dir/replay.log" && break
    grep -q "FATAL\|PANIC" "$dir/replay.log" && break
    sleep 0.1
done
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/base" stop -m fast >/dev/null
done_line=$(grep "redo done at" "$dir/replay.log") || die "no 'redo done' in the replay's log: $(tail -5 "$dir/replay.log")"
lsn_bytes() { echo $((0x${1%/*} * 4294967296 + 0x${1#*/})); }
from=$(lsn_bytes "$(sed -n 's/^START WAL LOCATION: \([0-9A-F/]*\) .*/\1/p' "$dir/base/backup_label.old")")
to=$(lsn_bytes "$(echo "$done_line" | sed 's/.*redo done at \([0-9A-F/]*\) .*/\1/')")
read -r user sys elapsed < <(echo "$done_line" |
    sed 's/.*CPU: user: \([0-9.]*\) s, system: \([0-9.]*\) s, elapsed: \([0-9.]*\) s.*/\1 \2 \3/')
awk -v b=$((to - from)) -v u="$user" -v s="$sys" -v e="$elapsed" 'BEGIN {
    mb = b / 1e6
    printf "record-wal: PostgreSQL replayed %.1f MB on one core: %.1f MB per CPU-second of its startup process (user %.2f s, system %.2f s), %.1f MB/s elapsed (%.2f s)\n", mb, mb / (u + s), u, s, mb / e, e
}'
