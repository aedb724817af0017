//! Tooling around walrelay, kept out of the relay runtime: nothing in `walrelay`'s library
//! imports this crate, and this crate does not import it (the `walrelay` binary uses it for
//! `demo` and `bench`, the tests for their clusters and processes). It drives the real binary
//! as a child process.
//!
//! Map:
//!
//! - [`cluster`]: throw-away PostgreSQL clusters (initdb, pg_ctl, pg_basebackup, pgbench), run
//!   as the `postgres` OS user when root; PostgreSQL 14–18 installs ([`cluster::majors`]);
//!   recorded WAL of real primaries ([`cluster::walrec`]).
//! - [`relayproc`]: `walrelay run --config FILE` as a child process: start, wait for its
//!   ports, signal, stop, CPU time.
//! - [`cpuwait`]: time runnable threads waited for a core (schedstat per process, CPU
//!   pressure of the machine), read by the bench beside CPU time.
//! - [`forward`]: a TCP forwarder for the link socket: counts bytes both ways; can cut, freeze
//!   or corrupt the link (tests).
//! - [`certs`]: throw-away CA and certificates (rcgen), mutual-TLS material of a link.
//! - [`prom`]: `GET /metrics` of a process and a strict Prometheus text-format parser.
//! - [`bench`]: `walrelay bench`: two relay pairs of the real binary (`wal` and `zstd`
//!   codecs) per workload, link bytes against offline zstd and `ssh -C` ([`bench::sshc`])
//!   on the same WAL, CPU, lag, sync-commit latency, a one-core codec replay.
//! - [`demo`]: `walrelay demo`: a primary, a standby, the binary between them, a live table,
//!   and zstd -3 and `ssh -C` of the load's WAL at the end.
//! - [`out`]: standard output of every `walrelay` subcommand, with no panic when the reader
//!   went away.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bench;
pub mod certs;
pub mod cluster;
pub mod cpuwait;
pub mod demo;
pub mod forward;
pub mod out;
pub mod prom;
pub mod relayproc;
