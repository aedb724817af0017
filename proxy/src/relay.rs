//! Starting and stopping the halves a configuration asks for, in one process.
//!
//! Shutdown: a signal (or the caller) cancels the token; listeners stop accepting, sessions end
//! with a FATAL to their standby, and [`Running::shutdown`] waits for them at most
//! `limits.drain_timeout_secs`. Reloading (SIGHUP) is in [`crate::lifecycle`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::Resolved;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::{upstream, walsender};

/// A running process: its listeners' addresses and tasks.
pub struct Running {
    pub upstream_addr: Option<SocketAddr>,
    pub downstream_addr: Option<SocketAddr>,
    /// Where `[metrics] listen` serves, if configured.
    pub metrics_addr: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    /// The settings in force (a reload replaces the parts that can change live).
    pub(crate) config: Resolved,
    pub(crate) upstream: Option<Arc<Live<upstream::Upstream>>>,
    pub(crate) downstream: Option<Arc<Live<walsender::Downstream>>>,
    /// The TLS files as last read (a reload reads them again when they changed on disk).
    pub(crate) tls_files: crate::tlsfiles::TlsFiles,
    tasks: Vec<JoinHandle<()>>,
}

/// Binds the configured listeners and starts the halves.
pub async fn start(cfg: Resolved, metrics: Arc<Metrics>) -> anyhow::Result<Running> {
    crate::tls::install_default_provider();
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    let mut upstream_addr = None;
    let mut downstream_addr = None;
    let (mut up_live, mut down_live) = (None, None);
    if let Some(u) = cfg.upstream.clone() {
        let listener = TcpListener::bind(u.listen)
            .await
            .with_context(|| format!("cannot listen on upstream.listen = {}", u.listen))?;
        upstream_addr = Some(listener.local_addr()?);
        info!(listen = %u.listen, primary = %u.primary.hosts_display(), "upstream half serving the link");
        let up = upstream::Upstream::new(
            u,
            cfg.link.clone(),
            cfg.limits.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
        let live = Live::new(up);
        up_live = Some(live.clone());
        let token = shutdown.clone();
        tasks.push(watched("the upstream half", &shutdown, async move {
            if let Err(e) = upstream::serve(live, listener).await {
                warn!("upstream half stopped: {e:#}");
                token.cancel();
            }
        }));
    }
    if let Some(d) = cfg.downstream.clone() {
        let listener = TcpListener::bind(d.listen)
            .await
            .with_context(|| format!("cannot listen on downstream.listen = {}", d.listen))?;
        downstream_addr = Some(listener.local_addr()?);
        info!(listen = %d.listen, upstream = %d.upstream, "downstream half serving standbys");
        let ds = walsender::Downstream::new(
            d,
            cfg.link.clone(),
            cfg.limits.clone(),
            metrics.clone(),
            shutdown.clone(),
        )?;
        let live = Live::new(ds);
        down_live = Some(live.clone());
        let serve = walsender::serve(live, listener);
        tasks.push(watched("the downstream half", &shutdown, serve));
    }
    let metrics_addr = match cfg.metrics {
        Some(addr) => Some(start_metrics(&cfg, addr, &metrics, &shutdown).await?),
        None => None,
    };
    let tls_files = crate::tlsfiles::TlsFiles::read(&cfg);
    tls_files.warn_validity(std::time::SystemTime::now());
    Ok(Running {
        upstream_addr,
        downstream_addr,
        metrics_addr,
        metrics,
        shutdown,
        tls_files,
        config: cfg,
        upstream: up_live,
        downstream: down_live,
        tasks,
    })
}

/// Serves `[metrics] listen` (see [`crate::monitor::http`]).
async fn start_metrics(
    cfg: &Resolved,
    addr: SocketAddr,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> anyhow::Result<SocketAddr> {
    use crate::monitor::{expo::Halves, http};
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on metrics.listen = {addr}"))?;
    let local = listener.local_addr()?;
    info!(listen = %local, "serving /metrics, /healthz, /status.json and the status page");
    let halves = Halves {
        upstream: cfg.upstream.is_some(),
        downstream: cfg.downstream.is_some(),
    };
    let server = http::Server::new(metrics.clone(), halves);
    let serve = http::serve(server, listener, shutdown.clone());
    watched("the metrics server", shutdown, serve);
    Ok(local)
}

/// Spawns one of the process's long-lived tasks (a listener's accept loop and what it
/// waits for). A panic in it would otherwise go unseen until shutdown while the process ran
/// on without, say, accepting standbys: it is logged and stops the process (`shutdown` is
/// cancelled, and `walrelay run` exits 1 as for a half that stopped by itself), so that its
/// supervisor restarts it.
fn watched(
    what: &'static str,
    shutdown: &CancellationToken,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let inner = tokio::spawn(task);
    let token = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = inner.await {
            if e.is_panic() {
                error!("{what} panicked: the process stops (see the panic above)");
                token.cancel();
            }
        }
    })
}

#[cfg(test)]
#[tokio::test]
async fn a_panicking_task_stops_the_process() {
    let shutdown = CancellationToken::new();
    let fine = watched("a task", &shutdown, async {});
    fine.await.unwrap();
    assert!(!shutdown.is_cancelled(), "a task that ends stops nothing");
    let panics = watched("a task", &shutdown, async { panic!("on purpose") });
    panics.await.unwrap();
    assert!(shutdown.is_cancelled());
}

impl Running {
    /// Cancels everything and waits for the halves to drain (bounded).
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let all = futures::future::join_all(self.tasks);
        let drain = Duration::from_secs(self.config.limits.drain_timeout_secs);
        if tokio::time::timeout(drain + Duration::from_secs(1), all)
            .await
            .is_err()
        {
            warn!("shutdown: halves did not stop within the drain timeout");
        }
        // What the spool holds, durable before the process exits: a restart then resumes
        // from all of it (the periodic sync would have left up to its period's WAL behind).
        if let Some(d) = &self.downstream {
            d.get().spooler.sync_at_shutdown().await;
        }
    }
}
