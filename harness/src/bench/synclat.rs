//! The commit latency walrelay adds to synchronous replication: `pgbench -N -c 1` with
//! `synchronous_standby_names` naming the standby behind the relay, then a standby connected
//! directly to the primary, each reconnected after the setting changed (walrelay reads it when a
//! standby's session starts); per-transaction latencies from `pgbench -l`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::pair::{PRIMARY_PASSWORD, USER};
use super::sites::Sites;
use crate::cluster::{wait_until, Cluster, StandbyOpts, TempRoot};

const DIRECT: &str = "bench_direct";
const WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Serialize)]
pub struct Latencies {
    pub transactions: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SyncLatency {
    pub pg_major: u32,
    pub seconds: u64,
    pub through_walrelay: Latencies,
    pub direct: Latencies,
    /// through_walrelay − direct.
    pub added_p50_ms: f64,
    pub added_p95_ms: f64,
}

/// Measures on `primary` (pgbench tables present), whose standby `relayed` streams through
/// walrelay; a direct standby is made and dropped here (on the standbys' CPUs with `sites`).
pub async fn measure(
    root: &TempRoot,
    primary: &Cluster,
    relayed: &str,
    seconds: u64,
    sites: Option<&Sites>,
) -> Result<SyncLatency> {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={USER} password={PRIMARY_PASSWORD} application_name={DIRECT}",
        primary.port()
    );
    let direct = primary
        .basebackup_standby(root, "standby_direct", &StandbyOpts::new(conninfo))
        .context("pg_basebackup of the direct standby")?;
    direct.start().await?;
    if let Some(s) = sites {
        s.pin_standby(&direct)?;
    }
    let through_walrelay = with_sync_standby(root, primary, relayed, seconds).await?;
    let direct_lat = with_sync_standby(root, primary, DIRECT, seconds).await;
    let reset = set_sync_names(primary, "").await;
    direct.stop().await?;
    let direct_lat = direct_lat?;
    reset?;
    Ok(SyncLatency {
        pg_major: primary.install().major,
        seconds,
        added_p50_ms: through_walrelay.p50_ms - direct_lat.p50_ms,
        added_p95_ms: through_walrelay.p95_ms - direct_lat.p95_ms,
        through_walrelay,
        direct: direct_lat,
    })
}

async fn set_sync_names(primary: &Cluster, names: &str) -> Result<()> {
    // One statement per call: ALTER SYSTEM cannot run in a multi-statement batch.
    primary
        .execute(&format!(
            "alter system set synchronous_standby_names = '{names}'"
        ))
        .await?;
    primary.execute("select pg_reload_conf()").await?;
    Ok(())
}

/// Names `app` in `synchronous_standby_names`, then makes it reconnect (its walsender on the
/// primary is terminated), as walrelay decides per session whether a standby is synchronous
/// (a synchronous one's WAL and feedback are never held for batching); waits until its new
/// connection is the synchronous standby.
async fn become_sync(primary: &Cluster, app: &str) -> Result<()> {
    set_sync_names(primary, &format!("\"{app}\"")).await?;
    let old = primary
        .query_one_string(&format!(
            "select coalesce(string_agg(pid::text, ','), '0') from pg_stat_replication where application_name = '{app}'"
        ))
        .await?;
    primary
        .execute(&format!(
            "select pg_terminate_backend(pid) from pg_stat_replication where application_name = '{app}'"
        ))
        .await?;
    let sql = format!(
        "select count(*)::text from pg_stat_replication where application_name = '{app}' and sync_state = 'sync' and state = 'streaming' and pid not in ({old})"
    );
    wait_until(
        &format!("{app} reconnected as the synchronous standby"),
        WAIT,
        || async { Ok(primary.query_one_string(&sql).await? == "1") },
    )
    .await?;
    Ok(())
}

/// Makes `app` the synchronous standby and runs pgbench against it.
async fn with_sync_standby(
    root: &TempRoot,
    primary: &Cluster,
    app: &str,
    seconds: u64,
) -> Result<Latencies> {
    become_sync(primary, app).await?;
    let prefix = root.path().join(format!("synclat-{app}"));
    let args = [
        "-n".to_string(),
        "-N".into(),
        "-c".into(),
        "1".into(),
        "-T".into(),
        seconds.to_string(),
        "-l".into(),
        format!("--log-prefix={}", prefix.display()),
        "postgres".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = tokio::process::Command::from(primary.pgbench(&args))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(seconds + 60), run)
        .await
        .context("pgbench for the sync latency did not end")??;
    anyhow::ensure!(
        out.status.success(),
        "pgbench -N -c 1 (sync standby {app}) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lat = read_logs(&prefix)?;
    anyhow::ensure!(!lat.is_empty(), "pgbench -l logged no transaction");
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
    Ok(Latencies {
        transactions: lat.len(),
        p50_ms: q(0.5),
        p95_ms: q(0.95),
    })
}

/// Latencies (µs, the third field) from every `<prefix>.<pid>[.<thread>]` log file.
fn read_logs(prefix: &Path) -> Result<Vec<u64>> {
    let dir = prefix.parent().context("log prefix without a directory")?;
    let stem = prefix
        .file_name()
        .context("log prefix without a name")?
        .to_string_lossy()
        .into_owned();
    let mut lat = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("{stem}."))
        {
            continue;
        }
        let text = std::fs::read_to_string(entry.path())?;
        lat.extend(
            text.lines()
                .filter_map(|l| l.split(' ').nth(2)?.parse::<u64>().ok()),
        );
    }
    Ok(lat)
}
