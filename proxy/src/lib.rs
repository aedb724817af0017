//! walrelay: a bandwidth-saving relay for PostgreSQL physical streaming replication.
//!
//! Map of the modules, in the order WAL flows through them:
//!
//! - [`lsn`]: protocol quantities (`Lsn`, `TimeLineId`).
pub mod lsn;
