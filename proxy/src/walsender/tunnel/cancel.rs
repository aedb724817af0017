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

/// Relays the cancel request `key` from `peer` if it names a live tunnel.
pub(crate) async fn forward(ds: &Downstream, peer: SocketAddr, key: Key) {
    if ds.cancels.get(key).is_none() {
        info!(%peer, "cancel request that names no live tunnel of this downstream: dropped (sessions served from the spool have nothing to cancel)");
        return;
    }
    let Some(channel) = ds.spooler.channel() else {
        warn!(%peer, "cannot relay a cancel request: the link to the upstream is not set up");
        return;
    };
    let mut client = LinkClient::new(channel);
    let wait = Duration::from_secs(ds.link_cfg.connect_timeout_secs.max(1) + 10);
    let (pid, key) = key;
    match tokio::time::timeout(wait, client.cancel(TunnelCancel { pid, key })).await {
        Ok(Ok(r)) if r.get_ref().found => {
            info!(%peer, "relayed a cancel request to the primary through the upstream")
        }
        Ok(Ok(_)) => {
            info!(%peer, "cancel request dropped: the upstream's end of the tunnel has ended")
        }
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
            warn!(%peer, "cannot relay a cancel request: the upstream half runs an older walrelay without cancel requests; upgrade it")
        }
        Ok(Err(s)) => warn!(%peer, "cannot relay a cancel request: {}", s.message()),
        Err(_) => {
            warn!(%peer, "cannot relay a cancel request: the upstream at {} did not answer in time; check the link", ds.cfg.upstream)
        }
    }
}
