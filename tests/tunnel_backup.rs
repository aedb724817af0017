//! Base backups through the relay beyond the plain ones of `tests/tunnel.rs` (#13): plain and
//! tar backups from PostgreSQL 14 and 18 primaries (the ends of the supported range), server-side
//! compression (PostgreSQL 15+) and incremental backups (PostgreSQL 17: `UPLOAD_MANIFEST`, a
//! COPY from the client, then `BASE_BACKUP ( INCREMENTAL )` on the same connection), each
//! checked with PostgreSQL's own tools and, for the incremental one, by starting the combined
//! backup and comparing its tables with the primary's; a backup client that stops reading
//! midway, which must hold back the primary rather than fill the relay's memory; and nine of
//! them, which must not hold back the WAL stream.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use common::split::{Split, SplitOpts};
use common::*;
use walrelay_harness::cluster::{Cluster, PrimaryOpts};

/// Runs one of the primary's client programs; panics with its stderr if it fails.
fn run(env: &Split, tool: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = env.primary.command(tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn verify(env: &Split, dir: &Path) {
    run(env, "pg_verifybackup", &[dir.as_os_str()]);
}

/// `pg_basebackup --compress=server-…` through the relay: in plain format (the client
/// decompresses what the primary compressed) the backup passes pg_verifybackup; in tar
/// format the archive is written as the primary compressed it (gzip here), and unpacked it
/// passes pg_verifybackup too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_compressed_backups_through_the_relay() {
    let env = Split::new(SplitOpts::default()).await;
    pgbench(&env.primary, &["-i", "-s", "1", "-q", "postgres"]);
    for method in ["server-zstd", "server-lz4", "server-gzip"] {
        let dir = env.root.path().join(format!("plain-{method}"));
        let (ok, err) = env.basebackup(&dir, &["-X", "fetch", &format!("--compress={method}")]);
        assert!(
            ok,
            "pg_basebackup --compress={method} through the relay: {err}"
        );
        verify(&env, &dir);
    }

    let tar = env.root.path().join("tar-gzip");
    let (ok, err) = env.basebackup(&tar, &["-Ft", "-X", "fetch", "--compress=server-gzip:5"]);
    assert!(
        ok,
        "pg_basebackup -Ft --compress=server-gzip through the relay: {err}"
    );
    let archive = std::fs::read(tar.join("base.tar.gz")).unwrap();
    assert_eq!(&archive[..2], b"\x1f\x8b", "base.tar.gz is not gzip");
    let unpacked = env.root.path().join("tar-gzip-unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    untar(&tar.join("base.tar.gz"), &unpacked);
    verify_unpacked(&env, &tar, &unpacked);
}

/// Unpacks `archive` (tar, gzip'd or not) into `into`.
fn untar(archive: &Path, into: &Path) {
    let out = std::process::Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tar backup in `tar` unpacked in `unpacked`: with its manifest, it passes
/// pg_verifybackup; neither half panicked.
fn verify_unpacked(env: &Split, tar: &Path, unpacked: &Path) {
    std::fs::copy(
        tar.join("backup_manifest"),
        unpacked.join("backup_manifest"),
    )
    .unwrap();
    verify(env, unpacked);
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
}

/// The ends of the supported range: PostgreSQL 14's pg_basebackup sends the old
/// `BASE_BACKUP LABEL '…' …` syntax and gets one COPY stream per tablespace and one for the
/// manifest, 18's the parenthesized options and one COPY stream with typed messages. Through
/// the relay, `-X fetch` (plain) passes pg_verifybackup and `-Ft -X stream` writes both tars,
/// which unpacked (with the WAL in `pg_wal/`) pass it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_backups_through_the_relay_on_pg14_and_pg18() {
    for major in [14, 18] {
        let env = Split::new(SplitOpts {
            major: Some(major),
            ..Default::default()
        })
        .await;
        pgbench(&env.primary, &["-i", "-s", "1", "-q", "postgres"]);
        let plain = env.root.path().join("plain");
        let (ok, err) = env.basebackup(&plain, &["-X", "fetch"]);
        assert!(
            ok,
            "PG {major}: pg_basebackup -X fetch through the relay: {err}"
        );
        verify(&env, &plain);

        let tar = env.root.path().join("tar");
        let (ok, err) = env.basebackup(&tar, &["-Ft", "-X", "stream"]);
        assert!(
            ok,
            "PG {major}: pg_basebackup -Ft -X stream through the relay: {err}"
        );
        let unpacked = env.root.path().join("tar-unpacked");
        std::fs::create_dir_all(unpacked.join("pg_wal")).unwrap();
        untar(&tar.join("base.tar"), &unpacked);
        untar(&tar.join("pg_wal.tar"), &unpacked.join("pg_wal"));
        verify_unpacked(&env, &tar, &unpacked);
    }
}

/// Names of the files under `dir` (recursively) whose name starts with `prefix`.
fn files_named(dir: &Path, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().unwrap().to_string_lossy().starts_with(prefix) {
                found.push(p.display().to_string());
            }
        }
    }
    found
}

/// PostgreSQL 17 incremental backup through the relay: a full backup, changes, then
/// `pg_basebackup --incremental=<full>/backup_manifest` (the manifest goes up through the
/// tunnel as COPY data); the incremental backup holds INCREMENTAL files and is smaller than
/// the full one; `pg_combinebackup` of the two passes pg_verifybackup, and the combined
/// cluster started on its own has the primary's tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_backup_through_the_relay_combines_into_the_primarys_contents() {
    let env = Split::new(SplitOpts {
        primary: PrimaryOpts {
            extra_conf: vec![("summarize_wal".into(), "on".into())],
            ..Default::default()
        },
        major: Some(17),
        ..Default::default()
    })
    .await;
    let p = &env.primary;
    pgbench(p, &["-i", "-s", "2", "-q", "postgres"]);
    let full = env.root.path().join("full");
    let (ok, err) = env.basebackup(&full, &["-X", "stream"]);
    assert!(ok, "full backup through the relay: {err}");

    pgbench(p, &["-t", "300", "-c", "2", "postgres"]);
    p.execute("create table after_full as select g, md5(g::text) from generate_series(1, 10000) g")
        .await
        .unwrap();
    let incr = env.root.path().join("incr");
    let manifest = format!("--incremental={}", full.join("backup_manifest").display());
    let (ok, err) = env.basebackup(&incr, &[&manifest, "-X", "fetch"]);
    assert!(ok, "incremental backup through the relay: {err}");
    assert!(
        !files_named(&incr, "INCREMENTAL.").is_empty(),
        "the incremental backup has no INCREMENTAL files"
    );
    let size = |d: &Path| -> u64 {
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("backup_manifest")).unwrap()).unwrap();
        manifest["Files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["Size"].as_u64().unwrap())
            .sum()
    };
    let (full_bytes, incr_bytes) = (size(&full), size(&incr));
    eprintln!("full backup {full_bytes} bytes, incremental {incr_bytes} bytes");
    assert!(
        incr_bytes < full_bytes / 2,
        "the incremental backup is not incremental"
    );

    let combined = env.root.path().join("combined");
    run(
        &env,
        "pg_combinebackup",
        &[
            full.as_os_str(),
            incr.as_os_str(),
            "-o".as_ref(),
            combined.as_os_str(),
        ],
    );
    verify(&env, &combined);
    let restored = Cluster::from_data_dir(p.install(), &env.root, "combined").unwrap();
    restored
        .start()
        .await
        .unwrap_or_else(|e| panic!("the combined backup does not start: {e}"));
    let mut tables = PGBENCH_TABLES.to_vec();
    tables.push("after_full");
    assert_eq!(
        tables_digest(&restored, &tables).await,
        tables_digest(p, &tables).await
    );
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
}

/// Resident memory of a process, bytes (VmRSS).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// A backup client that stops reading holds back the primary, not the relay's memory: with
/// 128 MiB of incompressible data and the client stalled, the primary's walsender has
/// streamed far less than the backup (pg_stat_progress_basebackup) and neither half grew by
/// anything near it; then the client reads on and gets the whole backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_backup_client_holds_back_the_primary_not_relay_memory() {
    let env = Split::new(SplitOpts::default()).await;
    let p = &env.primary;
    p.execute("create table noise(b bytea); alter table noise alter column b set storage external")
        .await
        .unwrap();
    for _ in 0..8 {
        p.execute("insert into noise select (select decode(string_agg(md5(i::text || random()::text), ''), 'hex') from generate_series(1, 65536) i) from generate_series(1, 16)")
            .await
            .unwrap();
    }
    env.wait_spool_caught_up().await;
    let pids = [env.upstream.pid().unwrap(), env.downstream.pid().unwrap()];
    let before = pids.map(rss);

    let mut child = tar_backup_to_stdout(&env);
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut read = 0u64;
    while read < MIB {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "the backup ended early");
        read += n as u64;
    }
    let held = wait_primary_stops_streaming(p).await;
    // The session continued in a tunnel: that tunnel is its one connection to the primary
    // (the standby connection opened for it at the session's start was closed).
    let senders = "select count(*)::text from pg_stat_activity where backend_type = 'walsender' and application_name = 'pg_basebackup'";
    assert_eq!(
        p.query_one_string(senders).await.unwrap(),
        "1",
        "walsenders of the primary for the one backup session"
    );
    let grown: Vec<u64> = pids
        .iter()
        .zip(before)
        .map(|(&pid, b)| rss(pid).saturating_sub(b))
        .collect();
    eprintln!("client stalled after {read} bytes: the primary streamed {held} bytes; relay memory grew by {grown:?} bytes (upstream, downstream)");
    assert!(
        held < 96 * MIB,
        "the primary streamed {held} bytes to a stalled client"
    );
    for g in grown {
        assert!(
            g < 64 * MIB,
            "a half grew by {g} bytes for a stalled client"
        );
    }

    // The client reads on and gets everything.
    let rest = tokio::task::spawn_blocking(move || {
        let mut n = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match out.read(&mut buf) {
                Ok(0) | Err(_) => return n,
                Ok(k) => n += k as u64,
            }
        }
    })
    .await
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "pg_basebackup failed");
    assert!(
        read + rest > 128 * MIB,
        "the backup has {} bytes",
        read + rest
    );
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
}

/// Nine backups whose clients stopped reading, each leaving a call's window (1 MiB) unread at
/// the downstream, beside a standby behind it: the standby replays what the primary writes
/// all the same. On one HTTP/2 connection those nine calls held its whole window (8 MiB, what
/// a call received and its reader did not take counting against the connection too), and the
/// WAL stream on it got nothing; the tunnels now have a connection of their own. The
/// downstream takes at most `limits.max_startups_per_address` (8 by default) connections
/// from one address in their handshakes at once and refuses the next: nine backups started
/// together from 127.0.0.1 sometimes found eight still authenticating (the full suite on two
/// busy cores), so this test allows sixteen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_whose_clients_stopped_reading_hold_up_no_wal() {
    let mut env = Split::new(SplitOpts {
        primary: PrimaryOpts {
            extra_conf: vec![("max_wal_senders".into(), "20".into())],
            ..Default::default()
        },
        // Nine backups' bytes compressed at once by debug builds on two cores can hold up
        // the answer to a link keepalive past the tests' usual 2 s, and the tunnels'
        // connection is then given up, as configured; that is not what this test is about.
        link_keepalive_secs: Some(10),
        downstream_limits: "max_startups_per_address = 16".into(),
        ..Default::default()
    })
    .await;
    env.add_standby("a");
    env.standbys[0].start().await.unwrap();
    env.wait_streaming(0).await;
    let p = &env.primary;
    // 128 MiB that does not compress: each backup is far more than what the kernel's socket
    // buffers on its way take (loopback's autotuning gives each up to 32 MB here) and what
    // both halves hold for a tunnel.
    p.execute("create table noise(b bytea); alter table noise alter column b set storage external")
        .await
        .unwrap();
    p.execute("insert into noise select (select decode(string_agg(md5(i::text || random()::text), ''), 'hex') from generate_series(1, 65536) i) from generate_series(1, 128)")
        .await
        .unwrap();
    env.wait_caught_up(0).await;
    let mut backups: Vec<std::process::Child> =
        (0..9).map(|_| tar_backup_to_stdout(&env)).collect();
    all_backups_stalled(p, &mut backups).await;
    // The upstream's connections to the primary keep alive: a tunnel's backup that only
    // reads finds a primary whose host vanished gone, rather than waiting for ever.
    let timers = tcp_timers_toward(env.upstream.pid().unwrap(), p.port());
    assert!(timers.len() > backups.len(), "{timers:?}");
    assert!(timers.iter().all(|t| t == "02"), "{timers:?}");
    p.execute("create table after_the_stall as select 1 x")
        .await
        .unwrap();
    env.wait_caught_up(0).await;
    for b in &mut backups {
        let _ = b.kill();
        let _ = b.wait();
    }
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
}

/// Waits until all `backups` are connected to the primary (each past its checkpoint) and none
/// of them moves any more. A backup that ended (refused, say) fails the test with its error:
/// none can end otherwise, each writing to a pipe nobody reads.
async fn all_backups_stalled(p: &Cluster, backups: &mut [std::process::Child]) {
    let streamed = "select (select count(*) from pg_stat_activity \
                    where application_name = 'pg_basebackup' and backend_type = 'walsender') \
                    || ':' || (select count(*) filter (where phase <> 'streaming database files' \
                    or backup_streamed = 0) from pg_stat_progress_basebackup) \
                    || ':' || coalesce((select string_agg(backup_streamed::text, ',' order by pid) \
                    from pg_stat_progress_basebackup), '')";
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut last = String::new();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        for b in backups.iter_mut() {
            if let Some(status) = b.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = b.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("a backup ended ({status}): {err}");
            }
        }
        let now = p.query_one_string(streamed).await.unwrap();
        if now == last && now.starts_with(&format!("{}:0:", backups.len())) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the backups did not all stall (connected:starting:streamed): {now}"
        );
        last = now;
    }
}

const MIB: u64 = 1 << 20;

/// `pg_basebackup` through the downstream, tar format to its stdout (piped, not read yet).
fn tar_backup_to_stdout(env: &Split) -> std::process::Child {
    env.primary
        .command("pg_basebackup")
        .args(env.client_args())
        .args([
            "-D",
            "-",
            "-Ft",
            "-X",
            "none",
            "-c",
            "fast",
            "--no-password",
        ])
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The client stalls: waits until the primary stops streaming (two equal readings of
/// pg_stat_progress_basebackup); returns the bytes it streamed.
async fn wait_primary_stops_streaming(p: &Cluster) -> u64 {
    let streamed =
        "select coalesce((select backup_streamed::text from pg_stat_progress_basebackup), '-1')";
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut last = String::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = p.query_one_string(streamed).await.unwrap();
        if now == last && now != "-1" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the primary kept streaming: {now}"
        );
        last = now;
    }
    last.parse().unwrap()
}
