//! SQL sessions through a tunnel (`downstream.allow_sql = true`), checked end to end with real
//! PostgreSQL clients, a real primary and the real binary as separate halves: a client that
//! pipelines its queries gets all its answers; the session says it is read-only; a message
//! over the upstream's limit names the setting; without `allow_sql`, the allowlist reads
//! SQL as PostgreSQL reads it.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::split::{Split, SplitOpts};
use common::*;
use walrelay_harness::cluster::{wait_until, PrimaryOpts};

/// The first query of the pipeline answers with this many rows of 1 MB; each of the
/// [`PIPELINED`] queries after it sends [`QUERY_BYTES`] (and gets a small answer).
const ANSWER_ROWS: usize = 64;
const PIPELINED: usize = 20;
const QUERY_BYTES: usize = 500_000;

/// Writes a pgbench script of one pipeline: a query with a large answer, then queries with
/// large texts. The answers are hexadecimal digits (md5) and so are the texts (random):
/// compression halves them at most, so they fill the link's flow-control windows as well
/// as the sockets on the way.
fn pipeline_script(path: &Path) {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut queries = String::new();
    for _ in 0..PIPELINED {
        let digits = hex_digits(&mut seed, QUERY_BYTES);
        queries.push_str(&format!("SELECT length('{digits}') AS sent;\n"));
    }
    let script = format!(
        "\\startpipeline\n\
         SELECT (SELECT string_agg(md5(g::text || '.' || i::text), '') FROM generate_series(1, 31250) i) FROM generate_series(1, {ANSWER_ROWS}) g;\n\
         {queries}\\endpipeline\n"
    );
    std::fs::write(path, script).unwrap();
}

/// `n` pseudo-random hexadecimal digits from `seed` (xorshift64, which it advances): text
/// that compression halves at most.
fn hex_digits(seed: &mut u64, n: usize) -> String {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            char::from(b"0123456789abcdef"[(*seed >> 60) as usize])
        })
        .collect()
}

/// A pipelining client (pgbench, `\startpipeline`, the extended protocol) sends queries
/// while the primary's answer to the first is still coming: 64 MB one way, 10 MB the other,
/// more than the sockets and the link's windows on the way hold. A backend blocked sending
/// answers reads no more queries, so a relay that waits on one direction before it reads the
/// other stops for good (the backend stays in ClientWrite); through walrelay pgbench
/// completes, and no backend is left behind on the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelining_client_gets_all_its_answers() {
    let env = Split::new(SplitOpts {
        downstream_extra: "allow_sql = true".into(),
        ..Default::default()
    })
    .await;
    let script = env.root.path().join("pipeline.sql");
    pipeline_script(&script);
    let mut pgbench = env
        .primary
        .command("pgbench")
        .args(env.client_args())
        .args(["-n", "-M", "extended", "-c", "1", "-t", "2", "-f"])
        .arg(&script)
        .arg("postgres")
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .env("PGCONNECT_TIMEOUT", "20")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (started, bound) = (Instant::now(), Duration::from_secs(60));
    while pgbench.try_wait().unwrap().is_none() {
        if started.elapsed() > bound {
            let _ = pgbench.kill();
            let _ = pgbench.wait();
            let stuck = env
                .primary
                .query_one_string("select coalesce(string_agg(state || '/' || coalesce(wait_event, ''), ', '), 'none') from pg_stat_activity where application_name = 'pgbench'")
                .await
                .unwrap();
            panic!("the pipelining client did not get its answers within {bound:?} (its backends on the primary: {stuck})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = pgbench.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = &env.primary;
    wait_until(
        "the tunnel's backend gone from the primary",
        TIMEOUT,
        || async move {
            Ok(p.query_one_string(
                "select count(*)::text from pg_stat_activity where application_name = 'pgbench'",
            )
            .await?
                == "0")
        },
    )
    .await
    .unwrap();
    env.upstream.assert_no_panic();
    env.downstream.assert_no_panic();
}

/// A tunnelled SQL session is read-only on the primary (the upstream sets
/// `default_transaction_read_only = on` after connecting), and its greeting says so: libpq
/// (PostgreSQL 14+, which takes the reported `default_transaction_read_only` at its word)
/// asked for `target_session_attrs=read-write` refuses the session as it refuses a read-only
/// server, rather than accepting it for writes that would fail later; `read-only` accepts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnelled_sql_session_is_greeted_as_read_only() {
    let env = Split::new(SplitOpts {
        downstream_extra: "allow_sql = true".into(),
        ..Default::default()
    })
    .await;
    let conninfo = |attrs: &str| {
        format!(
            "host=127.0.0.1 port={} user={STANDBY_USER} dbname=postgres target_session_attrs={attrs}",
            env.down_port
        )
    };
    let (ok, _, err) = psql_repl(
        &env.primary,
        &conninfo("read-write"),
        STANDBY_PASSWORD,
        "select 1",
    );
    assert!(!ok && err.contains("session is read-only"), "{err}");
    let (ok, out, err) = psql_repl(
        &env.primary,
        &conninfo("read-only"),
        STANDBY_PASSWORD,
        "show default_transaction_read_only",
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "on");
    env.upstream.assert_no_panic();
    env.downstream.assert_no_panic();
}

/// A client message larger than the upstream's `limits.max_message_bytes` (256 KiB here)
/// but within the downstream's (4 MiB): the link refuses the frame at the upstream, and the
/// client hears which setting to change instead of a bare close or "try again" (it would fail
/// the same way every time). A smaller one goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_upstreams_limit_names_the_setting() {
    let env = Split::new(SplitOpts {
        downstream_extra: "allow_sql = true".into(),
        upstream_limits: "max_message_bytes = 262144".into(),
        ..Default::default()
    })
    .await;
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} dbname=postgres",
        env.down_port
    );
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut digits = |n: usize| hex_digits(&mut seed, n);
    let small = format!("select length('{}')", digits(100_000));
    let (ok, out, err) = psql_repl(&env.primary, &conninfo, STANDBY_PASSWORD, &small);
    assert!(ok && out.trim() == "100000", "{out} {err}");
    // Hexadecimal digits compress to about half: 2 MB of them is well over 256 KiB on the link.
    let file = env.root.path().join("large.sql");
    std::fs::write(&file, format!("select length('{}');\n", digits(2_000_000))).unwrap();
    let out = env
        .primary
        .command("psql")
        .args([conninfo.as_str(), "-XAt", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(&file)
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .output()
        .unwrap();
    let (ok, err) = (out.status.success(), String::from_utf8_lossy(&out.stderr));
    assert!(
        !ok && err.contains("limits.max_message_bytes"),
        "{err}\n{}",
        env.upstream.log_text()
    );
    env.upstream.assert_no_panic();
    env.downstream.assert_no_panic();
}

/// The tunnel's SQL allowlist against what PostgreSQL reads differently from a simple scan:
/// on a `replication=database` session through the downstream (no `allow_sql`, no
/// `allow_slot_commands`), a lower-case `show` (SQL to PostgreSQL, whose replication keywords
/// are capitals), a string that hides a second statement, a function spelt with Unicode
/// escapes, a read-write transaction spelt past a simple check and a write inside COPY are all
/// refused; the primary's table and slot are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tunnel_allowlist_reads_sql_as_postgresql_does() {
    let env = Split::new(SplitOpts {
        primary: PrimaryOpts {
            wal_level: "logical".into(),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let p = &env.primary;
    p.create_physical_slot("victim").await.unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} replication=database dbname=postgres",
        env.down_port
    );
    for sql in [
        "show work_mem; CREATE TABLE pwned(x int)",
        "SELECT E'\\''; CREATE TABLE pwned(x int); --'",
        "SELECT $a$'$a$; CREATE TABLE pwned(x int); --'",
        "SELECT U&\"pg\\005fdrop_replication_slot\"('victim')",
        "SELECT query_to_xml('SELECT pg_drop_replication_slot(''victim'')', true, true, '')",
        "BEGIN READ ONLY READ  WRITE",
        "COPY (CREATE TABLE pwned AS SELECT 1 RETURNING 1) TO STDOUT",
        "COPY (DELETE FROM pg_class WHERE false RETURNING 1) TO STDOUT",
    ] {
        let (ok, _, err) = psql_repl(p, &conninfo, STANDBY_PASSWORD, sql);
        assert!(!ok && err.contains("allow_sql"), "{sql}: {err}");
    }
    // A physical session handed over by creating a temporary slot may stream on that slot
    // only, not on another client's (whose position its status updates would move).
    let physical = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} replication=true",
        env.down_port
    );
    let out = p
        .command("psql")
        .args([&physical, "-XAt"])
        .args([
            "-c",
            "CREATE_REPLICATION_SLOT tmp TEMPORARY PHYSICAL RESERVE_WAL",
        ])
        .args(["-c", "START_REPLICATION SLOT victim PHYSICAL 0/1000000"])
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("stream from replication slot \"victim\""),
        "{err}"
    );
    // What the allowlist is for still passes.
    let (ok, out, err) = psql_repl(p, &conninfo, STANDBY_PASSWORD, "SELECT 'it''s'");
    assert!(ok && out.trim() == "it's", "{err}");
    let count = |sql: &'static str| async move { p.query_one_string(sql).await.unwrap() };
    assert_eq!(
        count("select count(*)::text from pg_class where relname = 'pwned'").await,
        "0"
    );
    assert_eq!(
        count("select count(*)::text from pg_replication_slots where slot_name = 'victim'").await,
        "1"
    );
    env.downstream.assert_no_panic();
}
