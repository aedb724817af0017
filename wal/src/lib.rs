//! PostgreSQL WAL, as walrelay needs it: pure, sans-IO, no runtime (no tokio, no sockets).
//!
//! Map:
//!
//! - [`lsn`]: protocol quantities (`Lsn`, `TimeLineId`);
//! - [`timeline`]: timeline history files (parse, where a timeline ends);
//! - [`walcodec`]: the WAL-aware link codec: the WAL page and record format per major
//!   ([`walcodec::wal`]), the record tracker, the block and tuple caches, pglz and the
//!   recompression of images the primary compressed; its payload format is documented there;
//! - [`linkcodec`]: how the WAL bytes of one message travel (`wal`, streaming `zstd`, `none`)
//!   and the xxh3 check of what was restored.
//!
//! The runtime (`walrelay`), the tooling (`walrelay-harness`) and the fuzz targets build on
//! this crate; it depends on none of them.
pub mod linkcodec;
pub mod lsn;
pub mod timeline;
pub mod walcodec;
