//! Base backups through the relay beyond the plain ones of `tests/tunnel.rs` (#13): server-side
//! compression (PostgreSQL 15+) and incremental backups (PostgreSQL 17: `UPLOAD_MANIFEST`, a
//! COPY from the client, then `BASE_BACKUP ( INCREMENTAL )` on the same connection), each
//! checked with PostgreSQL's own tools and, for the incremental one, by starting the combined
//! backup and comparing its tables with the primary's.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::path::Path;

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
    let out = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(tar.join("base.tar.gz"))
        .arg("-C")
        .arg(&unpacked)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::copy(
        tar.join("backup_manifest"),
        unpacked.join("backup_manifest"),
    )
    .unwrap();
    verify(&env, &unpacked);
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
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
