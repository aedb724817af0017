//! The rig of one bench run: a primary with the workload's data, the two relay pairs of the
//! real binary (W with `codec = "wal"`, Z with `codec = "zstd"`), a standby behind each and
//! one connected to the primary directly, placed as `--z-background`, `--w-share`, `--sites`
//! and `--services` ask.

use anyhow::{Context, Result};

use super::opts::BenchOpts;
use super::pair::{self, RelayPair, CODECS, LONG_WAIT, PRIMARY_PASSWORD};
use super::workloads::Workload;
use super::{background, disk, services, standbys};
use crate::certs::LinkCerts;
use crate::cluster::{Cluster, PgInstall, PrimaryOpts, TempRoot};

/// Everything of one run. Fields drop in this order: relays, standbys, primary, directory.
pub(super) struct Rig {
    pub(super) pairs: [RelayPair; 2],
    pub(super) standbys: [Cluster; 2],
    /// A standby streaming from the primary itself, for the replay lag without a relay.
    pub(super) direct: Cluster,
    pub(super) primary: Cluster,
    pub(super) root: TempRoot,
    /// `--services`' groups, held for their drop, which comes after the clusters and relays
    /// stopped (fields drop in order).
    _services: Option<services::Services>,
}

/// Primary with data, two standbys copied from it, both relay pairs, standbys streaming.
pub(super) async fn setup(
    opts: &BenchOpts,
    install: &PgInstall,
    w: Workload,
    compression: &str,
) -> Result<Rig> {
    let root = TempRoot::new()?;
    let secs = opts.cold_secs + opts.warmup_secs + opts.steady_secs;
    disk::check_free_space(root.path(), w.disk_needed_gb(secs), w.name())?;
    let certs_dir = root.path().join("certs");
    std::fs::create_dir(&certs_dir)?;
    let certs = LinkCerts::generate(&certs_dir)?;
    let primary = start_primary(install, &root, w, compression, &opts.checkpoint_timeout).await?;
    let load_end = begin_after_load(&primary).await?;
    // The pairs first: a downstream's spool starts at the segment the primary is writing when
    // its stream opens, so standbys backed up after that find all they need in it.
    let site = pair::Site {
        bin: &opts.binary,
        dir: root.path(),
        primary: &primary,
        certs: &certs,
        spool_bytes: opts.spool_bytes,
    };
    let mut pairs = Vec::new();
    for (i, codec) in CODECS.into_iter().enumerate() {
        let tag = ["w", "z"][i];
        pairs.push(RelayPair::start_on_free_ports(&site, tag, codec)?);
    }
    let pairs: [RelayPair; 2] = pairs.try_into().map_err(|_| anyhow::anyhow!("two pairs"))?;
    for p in &pairs {
        p.wait_stream_open().await?;
    }
    let oldest = primary
        .query_lsn("select min(restart_lsn) from pg_replication_slots")
        .await?;
    anyhow::ensure!(
        oldest > load_end,
        "the relays' slots hold WAL from {oldest}, before the end of the workload's data ({load_end}): \
         their upstreams would encode the load before the cold window"
    );
    let down_ports = [pairs[0].down_port, pairs[1].down_port];
    let standbys = standbys::start_relayed_standbys(&primary, &root, down_ports).await?;
    if opts.z_background {
        background::lower(&pairs[1], &standbys[1])?;
    }
    if opts.w_share {
        background::favour(&pairs[0])?;
    }
    let direct = standbys::start_direct_standby(&primary, &root).await?;
    if let Some(s) = &opts.sites {
        let [a, b] = &standbys;
        s.pin(&primary, &pairs, &[a, b, &direct])?;
    }
    let services = match &opts.services {
        Some(h) => Some(place_services(
            opts, h, &primary, &pairs, &standbys, &direct,
        )?),
        None => None,
    };
    Ok(Rig {
        pairs,
        standbys,
        direct,
        primary,
        root,
        _services: services,
    })
}

/// `--services`: each cluster and relay process in a CPU group of its own.
fn place_services(
    opts: &BenchOpts,
    h: &services::Hierarchy,
    primary: &Cluster,
    pairs: &[RelayPair; 2],
    standbys: &[Cluster; 2],
    direct: &Cluster,
) -> Result<services::Services> {
    use services::Share;
    let [a, b] = standbys;
    let rig = services::Rig {
        primary,
        standbys: [a, b, direct],
        pairs,
    };
    let w = if opts.w_share {
        Share::Favoured
    } else {
        Share::Even
    };
    // Z in the background keeps its nice 19 outside the groups (`services`' module says why).
    let z = (!opts.z_background).then_some(Share::Even);
    services::place(h, &rig, w, z)
}

/// The workload's primary, started, with the replication user and the workload's data.
async fn start_primary(
    install: &PgInstall,
    root: &TempRoot,
    w: Workload,
    compression: &str,
    checkpoint_timeout: &str,
) -> Result<Cluster> {
    let popts = PrimaryOpts {
        checkpoint_timeout: checkpoint_timeout.into(),
        wal_compression: compression.into(),
        wal_level: w.wal_level().into(),
        extra_conf: vec![
            ("max_wal_size".into(), "4GB".into()),
            // Each window's WAL is copied out of pg_wal once the window is sampled.
            ("wal_keep_size".into(), "6GB".into()),
        ],
        ..Default::default()
    };
    let primary = Cluster::init_primary(install, root, "primary", &popts)?;
    primary.start().await?;
    primary.create_replication_user(PRIMARY_PASSWORD).await?;
    tokio::time::timeout(LONG_WAIT, w.prepare(&primary))
        .await
        .with_context(|| format!("preparing {} took more than {LONG_WAIT:?}", w.name()))??;
    Ok(primary)
}

/// Makes the relays start after the workload's data: returns where the load's WAL ends.
///
/// An upstream's new slot reserves WAL from the last checkpoint's redo pointer, and the stream
/// starts at the segment holding it. After the data load that pointer is still the primary's
/// first checkpoint (`max_wal_size` is large), so the upstreams encoded the whole load before
/// t = 0: W's DATA history (128 MiB) and tuple cache then held the rows the workload rewrites,
/// which neither a relay started on a loaded database, nor the cold replay, nor the offline
/// baselines of the window have. `toast`'s cold window (2026-11-27) gave W / zstd-3 0.32 live
/// against 0.62 replayed on the same WAL; with this, 0.58 and 0.57. A segment switch and a
/// checkpoint, before any relay exists, move that pointer past the load; the base backups
/// checkpoint again anyway, so the block cache gains nothing.
async fn begin_after_load(primary: &Cluster) -> Result<walrelay_wal::lsn::Lsn> {
    let load_end = primary
        .query_lsn("select pg_current_wal_insert_lsn()")
        .await?;
    primary
        .execute("select pg_switch_wal(); checkpoint")
        .await?;
    Ok(load_end)
}
