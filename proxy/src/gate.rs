//! The pre-authentication budget of the standby listener: how many connections may be in
//! startup or authentication at once, in all and per source address.
//!
//! A connection holds a [`StartupPass`] from accept until it has authenticated (or failed);
//! only then does it take a session slot ([`crate::live::SessionSlots`]). So peers that never
//! authenticate cannot use up `limits.max_sessions`, and one address cannot use up the whole
//! budget. Memory is bounded: the map holds only addresses with a pass out, at most
//! `max_startups` of them.
//!
//! Work is bounded too: a connection whose handshake failed (TLS, or not the protocol the
//! port speaks) keeps its place for `limits.auth_failure_delay_ms` after its socket closed
//! ([`StartupPass::release`]), as a wrong password does. Each TLS handshake costs the server
//! a signature, so without it one address failing handshakes in a loop costs a core; with it,
//! an address gets at most `max_startups_per_address` failed handshakes per delay (8 a second
//! by default), and all addresses together `max_startups`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Why a connection was refused a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `limits.max_startups` connections are in startup already.
    Total,
    /// `limits.max_startups_per_address` connections from this address are.
    PerAddress,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_addr: HashMap<IpAddr, usize>,
}

/// Connections in startup now, checked against limits that may change on reload (a lower limit
/// refuses new connections until enough have finished; it cuts none).
#[derive(Debug, Default)]
pub struct StartupGate(Mutex<Counts>);

/// One connection in startup; gives its place back when dropped.
#[derive(Debug)]
pub struct StartupPass {
    gate: Arc<StartupGate>,
    addr: IpAddr,
    /// The connection failed its handshake ([`StartupPass::failed`]).
    failed: AtomicBool,
}

impl StartupGate {
    pub fn new() -> Arc<StartupGate> {
        Arc::default()
    }

    /// A pass for a connection from `addr`, if both limits allow one more.
    pub fn try_enter(
        self: &Arc<Self>,
        addr: IpAddr,
        max_total: usize,
        max_per_addr: usize,
    ) -> Result<StartupPass, Refused> {
        let addr = source(addr);
        let mut c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if c.total >= max_total {
            return Err(Refused::Total);
        }
        let n = c.by_addr.get(&addr).copied().unwrap_or(0);
        if n >= max_per_addr {
            return Err(Refused::PerAddress);
        }
        c.by_addr.insert(addr, n + 1);
        c.total += 1;
        Ok(StartupPass {
            gate: self.clone(),
            addr,
            failed: AtomicBool::new(false),
        })
    }

    /// Connections in startup now.
    pub fn in_startup(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

/// The source a per-address limit counts: an IPv4 address (also written IPv4-mapped), or the
/// /64 network of an IPv6 address (one host usually has a whole /64 to pick addresses from).
fn source(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let net = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(net.into())
            }
        },
    }
}

impl StartupPass {
    /// Marks the connection as one whose handshake failed: [`StartupPass::release`] then keeps
    /// the place a while.
    pub fn failed(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// Gives the place back: at once, or after `delay` when the handshake failed (the
    /// connection's socket should be closed by then; only the place is kept).
    pub async fn release(self, delay: Duration) {
        if self.failed.load(Ordering::Relaxed) {
            tokio::time::sleep(delay).await;
        }
    }
}

impl Drop for StartupPass {
    fn drop(&mut self) {
        let mut c = self.gate.0.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_addr.get_mut(&self.addr) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_addr.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_and_per_address_limits() {
        let g = StartupGate::new();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = g.try_enter(a, 3, 2).unwrap();
        let _a2 = g.try_enter(a, 3, 2).unwrap();
        assert_eq!(g.try_enter(a, 3, 2).unwrap_err(), Refused::PerAddress);
        let b1 = g.try_enter(b, 3, 2).unwrap();
        assert_eq!(g.try_enter(b, 3, 2).unwrap_err(), Refused::Total);
        drop(a1);
        assert_eq!(g.in_startup(), 2);
        let _a3 = g.try_enter(a, 3, 2).unwrap();
        drop(b1);
        // An address with no pass out leaves the map: memory follows what is in startup.
        assert_eq!(g.0.lock().unwrap().by_addr.len(), 1);
    }

    #[tokio::test]
    async fn a_failed_handshake_keeps_its_place_for_the_delay() {
        let g = StartupGate::new();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let delay = Duration::from_millis(1500);
        // A handshake that completed gives its place back at once.
        let ok = g.try_enter(a, 4, 1).unwrap();
        let t = std::time::Instant::now();
        ok.release(delay).await;
        assert!(t.elapsed() < delay);
        let bad = g.try_enter(a, 4, 1).unwrap();
        bad.failed();
        let t = std::time::Instant::now();
        let held = tokio::spawn(bad.release(delay));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(g.try_enter(a, 4, 1).unwrap_err(), Refused::PerAddress);
        held.await.unwrap();
        assert!(t.elapsed() >= delay);
        assert_eq!(g.in_startup(), 0);
        let _again = g.try_enter(a, 4, 1).unwrap();
    }

    #[test]
    fn ipv6_addresses_count_per_64_and_mapped_ipv4_as_ipv4() {
        let g = StartupGate::new();
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _a = g.try_enter(a, 10, 1).unwrap();
        assert_eq!(g.try_enter(b, 10, 1).unwrap_err(), Refused::PerAddress);
        let _o = g.try_enter(other, 10, 1).unwrap();
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        let _v = g.try_enter(v4, 10, 1).unwrap();
        assert_eq!(g.try_enter(mapped, 10, 1).unwrap_err(), Refused::PerAddress);
    }
}
