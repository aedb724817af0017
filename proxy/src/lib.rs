//! walrelay: a bandwidth-saving relay for PostgreSQL physical streaming replication.
//!
//! Map of the modules, in the order WAL flows through them:
//!
//! ```text
//! primary ──▶ pgclient ──▶ upstream ──▶ codec ──▶ link ══▶ link ──▶ codec ──▶ walsender ──▶ standby
//!             (replication  (per-session  (encode)   (gRPC, mTLS)    (decode,    (serves the
//!              client)       pumps)                                   verify)     standby)
//! ```
//!
//! - [`pgwire`]: PostgreSQL protocol v3 framing, sans-IO, and the one I/O adapter that owns a socket.
//! - [`pgclient`]: the upstream's replication connection to the primary (TLS, SCRAM/md5).
//! - [`upstream`]: the half next to the primary: serves the link, one primary connection per standby session.
//! - [`codec`]: how WAL bytes travel on the link (`wal`, streaming zstd or none), verified by xxh3.
//! - [`walcodec`]: the WAL-aware codec: derivable bytes dropped, page images against a block
//!   cache, heap tuples as deltas, images the primary compressed recompressed exactly.
//! - [`bench`]: `walrelay bench`, the side-by-side comparison with generic zstd-3.
//! - [`link`]: gRPC channel/server setup, socket byte counting, delta-encoded WAL headers.
//! - [`walsender`]: the half next to the standbys: startup, authentication, relaying.
//! - [`replcmd`]: the replication commands a standby may send, parsed and re-rendered.
//! - [`scram`]: server side of SCRAM-SHA-256 for standbys.
//! - [`config`], [`conninfo`], [`tls`], [`logging`]: configuration, conninfo strings, rustls, tracing.
//! - [`metrics`]: process counters; [`monitor`]: per-standby state, codec totals, the
//!   `[metrics]` HTTP server (Prometheus, status page) and `walrelay status`.
//! - [`relay`]: starts and drains the configured halves; [`lifecycle`]: signals (SIGHUP reload,
//!   SIGTERM/SIGINT drain); [`live`]: settings a reload replaces for new connections.
//! - [`lsn`]: protocol quantities (`Lsn`, `TimeLineId`).
//! - [`cluster`], [`demo`]: throw-away PostgreSQL clusters for the demo, the bench and the tests.
pub mod bench;
pub mod cluster;
pub mod codec;
pub mod config;
pub mod conninfo;
pub mod demo;
pub mod lifecycle;
pub mod link;
pub mod live;
pub mod logging;
pub mod lsn;
pub mod metrics;
pub mod monitor;
pub mod pgclient;
pub mod pgwire;
pub mod relay;
pub mod replcmd;
pub mod scram;
pub mod tls;
pub mod upstream;
pub mod walcodec;
pub mod walsender;
