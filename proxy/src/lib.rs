//! walrelay: a bandwidth-saving relay for PostgreSQL physical streaming replication.
//!
//! Map of the modules, in the order WAL flows through them:
//!
//! - [`lsn`]: protocol quantities (`Lsn`, `TimeLineId`).
pub mod cluster;
pub mod codec;
pub mod config;
pub mod conninfo;
pub mod demo;
pub mod link;
pub mod logging;
pub mod lsn;
pub mod metrics;
pub mod pgclient;
pub mod pgwire;
pub mod relay;
pub mod replcmd;
pub mod scram;
pub mod tls;
pub mod upstream;
pub mod walsender;
