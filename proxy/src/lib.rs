//! walrelay: a bandwidth-saving relay for PostgreSQL physical streaming replication; this crate
//! is the relay runtime (sockets, sessions, configuration, telemetry) and the binary.
//!
//! Map of the modules, in the order WAL flows through them:
//!
//! ```text
//! primary ──▶ pgclient ──▶ upstream ──▶ link ══▶ link ──▶ walsender ──▶ standby
//!             (replication  (per-session  (gRPC, mTLS)    (serves the
//!              client)       pumps, encode)               standby; decode, verify)
//! ```
//!
//! - [`pgclient`]: the upstream's replication connection to the primary (TLS, SCRAM/md5).
//! - [`pgio`]: the one cancellation-safe adapter that owns a PostgreSQL socket's read side;
//!   [`tcp`]: the TCP options of PostgreSQL connections, to the primary and from clients
//!   (keepalive; the receive low-water mark; dropping bytes unread).
//! - [`upstream`]: the half next to the primary: serves the link; per downstream one stream
//!   whose feed reads the primary once and whose encode thread frames the WAL; per standby its
//!   own connection to the primary.
//! - [`spooler`]: the downstream's end of the stream: a decode thread restores, verifies and
//!   applies the frames, a writer thread keeps them in the [`spool`] that every standby is
//!   served from.
//! - [`link`]: gRPC channel/server setup, socket byte counting, delta-encoded WAL headers.
//! - [`walsender`]: the half next to the standbys: startup, authentication, relaying; its
//!   `tunnel` carries the client sessions the spool does not serve (base backups, logical
//!   replication, slot synchronization) to the primary through the upstream, behind an
//!   allowlist.
//! - [`config`], [`conninfo`], [`tls`], [`logging`]: configuration, conninfo strings, rustls, tracing;
//!   [`tlsfiles`]: the TLS files read at start (changed on disk? certificates expired?).
//! - [`metrics`]: process counters; [`monitor`]: per-standby state, codec totals, the
//!   `[metrics]` HTTP server (Prometheus, status page) and `walrelay status`.
//! - [`relay`]: starts and drains the configured halves; [`lifecycle`]: signals (SIGHUP reload,
//!   SIGTERM/SIGINT drain) and no transparent huge pages for the process; [`live`]: settings a
//!   reload replaces for new connections.
//! - [`coreshare`]: whether a stage's thread gets a CPU when it wants one (its own
//!   `schedstat`), which decides if the encode and decode stages use a second core.
//! - [`gate`]: the standby listener's pre-authentication budget (in all and per address).
//! - [`cancelkeys`]: the BackendKeyData of live tunnels, for relaying cancel requests.
//!
//! The other crates of the workspace:
//!
//! - `walrelay-wal` (`wal/`): pure: LSNs, PostgreSQL majors and WAL segments, the WAL format,
//!   the WAL-aware codec, the link codec;
//! - `walrelay-pgwire` (`pgwire/`): pure: PostgreSQL protocol framing, replication commands, SCRAM;
//! - `walrelay-proto` (`proto/`): the link protocol (gRPC handshake, frames);
//! - `walrelay-harness` (`harness/`): tooling: throw-away PostgreSQL clusters, recorded WAL,
//!   the binary as a child process, `walrelay bench` and `walrelay demo` (only the binary's
//!   `main.rs` uses it, never this library).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cancelkeys;
pub mod config;
pub mod conninfo;
pub mod coreshare;
#[cfg(test)]
mod error_chains;
pub mod gate;
pub mod lifecycle;
pub mod link;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod monitor;
pub mod pgclient;
pub mod pgio;
pub mod relay;
pub mod silence;
pub mod spool;
pub mod spooler;
pub mod tcp;
#[cfg(test)]
mod testwal;
pub mod tls;
pub mod tlsfiles;
pub mod upstream;
pub mod walsender;
