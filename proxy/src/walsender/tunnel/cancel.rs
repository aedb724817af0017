//! Cancel requests for tunnelled sessions: a client's CancelRequest (a new connection whose
//! startup packet carries the BackendKeyData it was given) that names a live tunnel of this
//! downstream goes to the upstream (`Cancel` call), which sends the primary a CancelRequest
//! with the key of the tunnel's own backend. Others are dropped, as PostgreSQL drops cancel
//! requests that match no backend; the client hears nothing either way.

use std::net::SocketAddr;
use std::time::Duration;

use tracing::{info, warn};

use walrelay_proto::link::link_client::LinkClient;
use walrelay_proto::link::TunnelCancel;

use super::super::Downstream;
use crate::cancelkeys::Key;
use crate::metrics::Metrics;

/// Relays the cancel request `key` from `peer` if it names a live tunnel.
pub(crate) async fn forward(ds: &Downstream, peer: SocketAddr, key: Key) {
    let [relayed, no_tunnel, failed] = &ds.metrics.tunnel_cancels;
    if ds.cancels.get(key).is_none() {
        Metrics::add(no_tunnel, 1);
        // Anyone can send these, in a loop: logged within the budget of refusals before
        // authentication, counted all the same.
        if let Some(more) = crate::walsender::pre_auth_log(crate::walsender::PreAuth::Cancel) {
            info!(%peer, "cancel request that names no live tunnel of this downstream: dropped (sessions served from the spool have nothing to cancel){more}");
        }
        return;
    }
    match ask_upstream(ds, key).await {
        Ok(true) => {
            Metrics::add(relayed, 1);
            info!(%peer, "relayed a cancel request to the primary through the upstream")
        }
        Ok(false) => {
            Metrics::add(no_tunnel, 1);
            info!(%peer, "cancel request dropped: the upstream's end of the tunnel has ended")
        }
        Err(why) => {
            Metrics::add(failed, 1);
            warn!(%peer, "cannot relay a cancel request: {why}")
        }
    }
}

/// The upstream's `Cancel` call: whether it found the tunnel (and sent the primary a cancel
/// request), or why it could not be asked.
async fn ask_upstream(ds: &Downstream, (pid, key): Key) -> Result<bool, String> {
    let Some(channel) = ds.spooler.channel() else {
        return Err("the link to the upstream is not set up".into());
    };
    let mut client = LinkClient::new(channel);
    let wait = Duration::from_secs(ds.link_cfg.connect_timeout_secs.max(1) + 10);
    match tokio::time::timeout(wait, client.cancel(TunnelCancel { pid, key })).await {
        Ok(Ok(r)) => Ok(r.get_ref().found),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Err(
            "the upstream half runs an older walrelay without cancel requests; upgrade it".into(),
        ),
        Ok(Err(s)) => Err(s.message().to_string()),
        Err(_) => Err(format!(
            "the upstream at {} did not answer in time; check the link",
            ds.cfg.upstream
        )),
    }
}
