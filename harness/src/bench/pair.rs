//! One relay pair as a user runs it: an upstream process next to the primary, a downstream
//! process next to the standby, each the real `walrelay run` with its own config file, mutual
//! TLS on the link, and a counting forwarder on the link socket between them. Each process
//! runs in a session of its own, as a service manager starts a daemon
//! ([`Session::Own`]): where Linux shares the CPU between sessions
//! first (autogroup), each half then competes for a core as one, as every PostgreSQL process
//! of the run does (each is a session leader), not together with the other pair, the bench
//! and its load in the bench's session.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::certs::{toml_str, LinkCerts};
use crate::cluster::{free_port, Cluster};
use crate::forward::Forwarder;
use crate::prom;
use crate::relayproc::{RelayProcess, Session};

use super::stages::RelayPositions;

/// The two pairs' codecs, W's first.
pub(super) const CODECS: [&str; 2] = ["wal", "zstd"];
/// Catching up, replaying, copying: every wait of a run is bounded by this.
pub(super) const LONG_WAIT: Duration = Duration::from_secs(600);

/// The replication user's password on the primary (the upstream logs in with it).
pub const PRIMARY_PASSWORD: &str = "bench-primary";
/// The standbys' password at the downstream (SCRAM against a verifier in its config).
pub const STANDBY_PASSWORD: &str = "bench-standby";
pub const USER: &str = "replicator";

/// How long an orderly stop (SIGTERM, drain) may take before the process is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the check after the load waits for each process's `/metrics`.
const FINAL_CHECK_WAIT: Duration = Duration::from_secs(60);
/// How long the check during the load waits: a process at nice 19 that does not answer by
/// then is checked again ten samples later, and by [`check_integrity`] after the load.
pub const RUNNING_CHECK_WAIT: Duration = Duration::from_secs(2);

/// What every pair of a run shares: the `walrelay` binary, the directory for its files, the
/// primary and the link's certificates.
#[derive(Clone, Copy)]
pub struct Site<'a> {
    pub bin: &'a Path,
    pub dir: &'a Path,
    pub primary: &'a Cluster,
    pub certs: &'a LinkCerts,
    /// `downstream.spool_bytes` (None: the relay's default).
    pub spool_bytes: Option<u64>,
}

/// Counters of one pair at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PairCounters {
    /// Link socket bytes toward the standby side (upstream → downstream).
    pub toward_standby: u64,
    /// Link socket bytes toward the primary side (feedback, requests).
    pub toward_primary: u64,
    /// CPU seconds of the upstream and the downstream process.
    pub cpu_up: f64,
    pub cpu_down: f64,
    /// Of those, the seconds in the kernel.
    pub kernel_up: f64,
    pub kernel_down: f64,
    /// Seconds the upstream's and the downstream's threads waited for a core (NaN where the
    /// kernel does not keep it).
    pub wait_up: f64,
    pub wait_down: f64,
    /// The upstream's and the downstream's largest resident set so far, bytes (NaN when
    /// unknown).
    pub peak_rss_up: f64,
    pub peak_rss_down: f64,
    /// Their resident sets now, bytes (NaN when unknown).
    pub rss_up: f64,
    pub rss_down: f64,
    /// Link messages, summed over every `walrelay_link_messages_sent_total` series of both
    /// processes (NaN when not scraped).
    pub messages: f64,
    /// `walrelay_link_payload_bytes_total{half="upstream"}`: the WAL payload bytes sent.
    pub payload: f64,
    /// `walrelay_codec_staged_messages_total` of the upstream's and the downstream's half:
    /// WAL runs each staged one batch ahead while behind (NaN when not scraped).
    pub staged: [f64; 2],
    /// `walrelay_codec_fast_messages_total` of the upstream: batches encoded at the fast
    /// zstd level while it fell behind on CPU (`link.catch_up`; NaN when not scraped).
    pub fast: f64,
    /// `walrelay_codec_fast_spells_total` of the upstream: times the fast level went on (NaN
    /// when not scraped).
    pub fast_spells: f64,
    /// The upstream's codec counters, [`CODEC_COUNTERS`] in order (NaN when not scraped).
    pub codec: [f64; 4],
}

/// The upstream's codec counters a window reports (`PairCut::codec`): records a link
/// message's end cut and records held back for the next, images through the block cache and
/// of those cache hits.
pub const CODEC_COUNTERS: [&str; 4] = [
    "walrelay_codec_records_cut_total",
    "walrelay_codec_records_held_total",
    "walrelay_codec_fpis_total",
    "walrelay_codec_fpi_cache_hits_total",
];

/// `primary_conninfo` of a standby streaming through the downstream on `down_port`.
pub fn standby_conninfo(down_port: u16, application_name: &str) -> String {
    format!(
        "host=127.0.0.1 port={down_port} user={USER} password={STANDBY_PASSWORD} application_name={application_name}"
    )
}

pub struct RelayPair {
    /// "wal" or "zstd".
    pub codec: &'static str,
    upstream: RelayProcess,
    downstream: RelayProcess,
    forwarder: Forwarder,
    up_metrics: u16,
    down_metrics: u16,
    /// Where the downstream serves standbys.
    pub down_port: u16,
    /// The downstream's `name`.
    tag: String,
}

/// Start-up attempts of a pair whose ports something else took first.
const START_TRIES: usize = 3;

impl RelayPair {
    /// application_name of the upstream's replication connection that reads the WAL for the
    /// stream (`walrelay_<downstream name>`); the standby's own connection has the standby's.
    pub fn feed_application_name(&self) -> String {
        format!("walrelay_{}", self.tag)
    }

    /// The pid of each half while it runs, named.
    pub fn pids(&self) -> [(&'static str, Option<u32>); 2] {
        [
            ("upstream", self.upstream.pid()),
            ("downstream", self.downstream.pid()),
        ]
    }

    /// Waits until the downstream's link stream is open (its spool has a start position).
    pub async fn wait_stream_open(&self) -> Result<(), crate::cluster::ClusterError> {
        crate::cluster::wait_until(
            "the downstream's link stream open",
            Duration::from_secs(60),
            || async { Ok(self.downstream.log_text().contains("link stream open")) },
        )
        .await
    }

    /// [`RelayPair::start`] on ports free when asked, again on others (up to [`START_TRIES`]
    /// times) when a half could not listen because something took its port first. A bench
    /// run under the test suite failed so (2026-12-05), when ports came from the kernel's
    /// ephemeral range, where any outgoing connection may take them. [`free_port`] now
    /// chooses outside it, but another process choosing from the same ports (the test
    /// process beside the bench) can still take one first, and so can a connection when
    /// [`free_port`] falls back to the kernel's choice.
    pub fn start_on_free_ports(site: &Site, tag: &str, codec: &'static str) -> Result<RelayPair> {
        let mut tries = 1;
        loop {
            match RelayPair::start(site, tag, codec) {
                Err(e)
                    if tries < START_TRIES
                        && format!("{e:#}").contains("Address already in use") =>
                {
                    crate::errln!("bench: the {codec} pair's port was taken before it listened; starting it again on others");
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// Starts the upstream (dialing the site's primary), the forwarder and the downstream
    /// with link codec `codec`, each on ports free when asked; files go to the site's
    /// directory (`<tag>-upstream.toml`, `.log`, ...).
    fn start(site: &Site, tag: &str, codec: &'static str) -> Result<RelayPair> {
        let Site {
            bin,
            dir,
            primary,
            certs,
            spool_bytes,
        } = *site;
        let (up_port, up_metrics) = (free_port(), free_port());
        let (down_port, down_metrics) = (free_port(), free_port());
        let up_toml = format!(
            "[upstream]\nprimary = {}\nlisten = \"127.0.0.1:{up_port}\"\n\n[link]\n{}\n[metrics]\nlisten = \"127.0.0.1:{up_metrics}\"\n",
            toml_str(&format!(
                "host=127.0.0.1 port={} user={USER} password={PRIMARY_PASSWORD} sslmode=disable",
                primary.port()
            )),
            certs.upstream_toml()
        );
        let upstream = RelayProcess::start(
            bin,
            dir,
            &format!("{tag}-upstream"),
            &up_toml,
            &[up_port, up_metrics],
            None,
            Session::Own,
        )?;
        let forwarder = Forwarder::start(up_port)?;
        let down_toml = format!(
            "[downstream]\nlisten = \"127.0.0.1:{down_port}\"\nupstream = \"127.0.0.1:{}\"\nauth = \"scram-sha-256\"\nusers = {{ {USER} = {} }}\nspool_dir = {}\nname = \"{tag}\"\n{}\n[link]\n{}tls_server_name = \"localhost\"\ncodec = \"{codec}\"\n\n[metrics]\nlisten = \"127.0.0.1:{down_metrics}\"\n",
            forwarder.port,
            toml_str(&walrelay_pgwire::scram::new_verifier(STANDBY_PASSWORD)),
            toml_str(&dir.join(format!("{tag}-spool")).display().to_string()),
            spool_bytes.map_or(String::new(), |b| format!("spool_bytes = {b}\n")),
            certs.downstream_toml()
        );
        let downstream = RelayProcess::start(
            bin,
            dir,
            &format!("{tag}-downstream"),
            &down_toml,
            &[down_port, down_metrics],
            None,
            Session::Own,
        )?;
        Ok(RelayPair {
            codec,
            upstream,
            downstream,
            forwarder,
            up_metrics,
            down_metrics,
            down_port,
            tag: tag.to_string(),
        })
    }

    /// Socket bytes and CPU now; with `scrape`, also the link message and payload counters
    /// (else NaN) and the relay's stage positions (else None).
    pub async fn counters(&self, scrape: bool) -> Result<(PairCounters, Option<RelayPositions>)> {
        let up = self.upstream.cpu_times().context("the upstream is gone")?;
        let down = self
            .downstream
            .cpu_times()
            .context("the downstream is gone")?;
        let (up_mem, down_mem) = (self.upstream.resident(), self.downstream.resident());
        let mut c = PairCounters {
            toward_standby: self.forwarder.bytes_from_target(),
            toward_primary: self.forwarder.bytes_toward_target(),
            cpu_up: up.total,
            cpu_down: down.total,
            kernel_up: up.kernel,
            kernel_down: down.kernel,
            wait_up: self.upstream.cpu_wait_seconds().unwrap_or(f64::NAN),
            wait_down: self.downstream.cpu_wait_seconds().unwrap_or(f64::NAN),
            peak_rss_up: bytes_or_nan(up_mem.map(|r| r.peak)),
            peak_rss_down: bytes_or_nan(down_mem.map(|r| r.peak)),
            rss_up: bytes_or_nan(up_mem.map(|r| r.now)),
            rss_down: bytes_or_nan(down_mem.map(|r| r.now)),
            messages: f64::NAN,
            payload: f64::NAN,
            staged: [f64::NAN; 2],
            fast: f64::NAN,
            fast_spells: f64::NAN,
            codec: [f64::NAN; 4],
        };
        if scrape {
            let (up, down) = tokio::try_join!(
                prom::scrape(self.up_metrics),
                prom::scrape(self.down_metrics)
            )?;
            let msgs = "walrelay_link_messages_sent_total";
            c.messages = prom::sum(&up, msgs, &[]) + prom::sum(&down, msgs, &[]);
            c.payload = prom::sum(
                &up,
                "walrelay_link_payload_bytes_total",
                &[("half", "upstream")],
            );
            let staged = "walrelay_codec_staged_messages_total";
            c.staged = [
                prom::sum(&up, staged, &[("half", "upstream")]),
                prom::sum(&down, staged, &[("half", "downstream")]),
            ];
            c.fast = prom::sum(&up, "walrelay_codec_fast_messages_total", &[]);
            c.fast_spells = prom::sum(&up, "walrelay_codec_fast_spells_total", &[]);
            c.codec = CODEC_COUNTERS.map(|name| prom::sum(&up, name, &[]));
            return Ok((c, RelayPositions::from_scrapes(&up, &down)));
        }
        Ok((c, None))
    }

    /// `walrelay_integrity_failures_total` of both processes; None when either did not
    /// answer within `wait` (under `--z-background` pair Z runs at nice 19, and on a busy CPU
    /// it can take seconds to answer).
    pub async fn integrity_failures(&self, wait: Duration) -> Result<Option<f64>> {
        let mut n = 0.0;
        for port in [self.up_metrics, self.down_metrics] {
            let samples = match prom::scrape_within(port, wait).await {
                Ok(s) => s,
                Err(prom::PromError::NoAnswer { .. }) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            n += prom::sum(&samples, "walrelay_integrity_failures_total", &[]);
        }
        Ok(Some(n))
    }

    /// Errors (with the log's end) if either process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        for p in [&mut self.upstream, &mut self.downstream] {
            if !p.is_running() {
                anyhow::bail!(
                    "walrelay ({}) exited during the bench; its log ends with:\n{}",
                    p.config.display(),
                    p.log_tail(40)
                );
            }
        }
        Ok(())
    }

    /// Whether either process logged a panic or WAL that failed verification.
    pub fn log_problems(&self) -> Option<String> {
        [&self.upstream, &self.downstream].iter().find_map(|p| {
            let log = p.log_text();
            (log.contains("panicked") || log.contains("failed verification")).then(|| {
                format!(
                    "{} logged a panic or WAL that failed verification:\n{}",
                    p.log.display(),
                    p.log_tail(40)
                )
            })
        })
    }

    /// SIGTERM to both (the downstream first), each waited for up to 15 s.
    pub fn stop(&mut self) {
        for p in [&mut self.downstream, &mut self.upstream] {
            if p.terminate(STOP_TIMEOUT).is_none_or(|s| !s.success()) {
                tracing::warn!(log = %p.log.display(), "walrelay did not exit cleanly on SIGTERM");
            }
        }
    }
}

/// A resident set's bytes as a counter value (NaN when unknown).
fn bytes_or_nan(bytes: Option<u64>) -> f64 {
    bytes.map_or(f64::NAN, |b| b as f64)
}

/// The integrity counters of every process (must be 0) and their logs (no panic).
pub async fn check_integrity(pairs: &[RelayPair]) -> Result<f64> {
    let mut failures = 0.0;
    for p in pairs {
        failures += p
            .integrity_failures(FINAL_CHECK_WAIT)
            .await?
            .with_context(|| {
                format!(
                    "the {} pair's /metrics did not answer within {FINAL_CHECK_WAIT:?} after the load",
                    p.codec
                )
            })?;
        if let Some(problem) = p.log_problems() {
            anyhow::bail!(problem);
        }
    }
    anyhow::ensure!(
        failures == 0.0,
        "{failures} link messages failed verification (walrelay_integrity_failures_total)"
    );
    Ok(failures)
}
