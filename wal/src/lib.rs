//! PostgreSQL WAL, as walrelay needs it: pure, sans-IO, no runtime (no tokio, no sockets).
//!
//! Map:
//!
//! - [`lsn`]: protocol quantities (`Lsn`, `TimeLineId`);
//! - [`pg`]: the supported PostgreSQL majors ([`pg::PgMajor`]) and the WAL format facts that
//!   differ between them (XLOG_PAGE_MAGIC, image flags);
//! - [`segment`]: WAL segment sizes, the file names of segments and timeline history files;
//! - [`timeline`]: timeline history files (parse, where a timeline ends);
//! - [`walcodec`]: the WAL-aware link codec: the WAL page and record format
//!   ([`walcodec::wal`]), the record tracker, the block and tuple caches, pglz and the
//!   recompression of images the primary compressed; its payload format is documented there;
//! - [`linkcodec`]: how the WAL bytes of one message travel (`wal`, streaming `zstd`, `none`)
//!   and the xxh3 check of what was restored.
//!
//! The runtime (`walrelay`), the tooling (`walrelay-harness`) and the fuzz targets build on
//! this crate; it depends on none of them.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod linkcodec;
pub mod lsn;
pub mod pg;
pub mod segment;
pub mod timeline;
pub mod walcodec;
