//! Tooling around walrelay, kept out of the relay runtime: nothing in `walrelay`'s library
//! imports this crate (the `walrelay` binary uses it for `demo` and `bench`, the tests for
//! their clusters).
//!
//! Map:
//!
//! - [`cluster`]: throw-away PostgreSQL clusters (initdb, pg_ctl, pg_basebackup, pgbench), run
//!   as the `postgres` OS user when root; PostgreSQL 14–18 installs ([`cluster::majors`]);
//!   recorded WAL of real primaries ([`cluster::walrec`]).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cluster;
