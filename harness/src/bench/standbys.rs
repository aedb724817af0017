//! The bench's standbys: W's and Z's, streaming through their downstreams, and the direct
//! one, streaming from the primary itself; each waited for until it streams and has received
//! all the primary wrote.

use std::time::Duration;

use anyhow::{Context, Result};

use super::pair::{self, CODECS, LONG_WAIT};
use crate::cluster::{wait_until, Cluster, StandbyOpts, TempRoot};
use pair::PRIMARY_PASSWORD;

/// application_name of W's and Z's standbys.
pub(super) const APPS: [&str; 2] = ["bench_w", "bench_z"];
/// application_name of the standby connected to the primary without a relay, the reference
/// for replay lag (the sync-latency run makes its own, `synclat::DIRECT`).
pub(super) const DIRECT_APP: &str = "bench_lag_ref";

/// The standbys of W and Z, backed up from the primary, streaming through the downstreams
/// on `down_ports`.
pub(super) async fn start_relayed_standbys(
    primary: &Cluster,
    root: &TempRoot,
    down_ports: [u16; 2],
) -> Result<[Cluster; 2]> {
    let mut standbys = Vec::new();
    for (i, app) in APPS.iter().enumerate() {
        let mut so = StandbyOpts::new(pair::standby_conninfo(down_ports[i], app));
        so.application_name = Some(app.to_string());
        standbys.push(
            primary
                .basebackup_standby(root, &format!("standby_{}", CODECS[i]), &so)
                .context("pg_basebackup of a standby")?,
        );
    }
    let standbys: [Cluster; 2] = standbys
        .try_into()
        .map_err(|_| anyhow::anyhow!("two standbys"))?;
    for s in &standbys {
        s.start().await?;
    }
    for (s, port) in standbys.iter().zip(down_ports) {
        wait_streaming(primary, s, port).await?;
    }
    Ok(standbys)
}

/// The reference standby, streaming from the primary itself.
pub(super) async fn start_direct_standby(primary: &Cluster, root: &TempRoot) -> Result<Cluster> {
    let mut so = StandbyOpts::new(format!(
        "host=127.0.0.1 port={} user={} password={PRIMARY_PASSWORD} application_name={DIRECT_APP}",
        primary.port(),
        pair::USER
    ));
    so.application_name = Some(DIRECT_APP.to_string());
    let direct = primary
        .basebackup_standby(root, "standby_lag_ref", &so)
        .context("pg_basebackup of the direct standby")?;
    direct.start().await?;
    wait_streaming(primary, &direct, primary.port()).await?;
    Ok(direct)
}

/// Waits until `standby` streams through the downstream on `port` and has received all the
/// primary wrote.
async fn wait_streaming(primary: &Cluster, standby: &Cluster, port: u16) -> Result<()> {
    let want = format!("streaming:{port}");
    let sql =
        "select coalesce((select status || ':' || sender_port from pg_stat_wal_receiver), '')";
    wait_until(
        "a standby streaming through its relay pair",
        Duration::from_secs(120),
        || async { Ok(standby.query_one_string(sql).await? == want) },
    )
    .await
    .with_context(|| format!("standby log:\n{}", standby.log_tail(20)))?;
    let target = primary
        .query_lsn("select pg_current_wal_lsn()::text")
        .await?;
    wait_until("a standby catching up", LONG_WAIT, || async {
        Ok(standby
            .query_lsn("select pg_last_wal_receive_lsn()::text")
            .await?
            >= target)
    })
    .await?;
    Ok(())
}
