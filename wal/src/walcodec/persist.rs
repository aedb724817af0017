//! The caches of a session saved and restored, so that a new session (a restart, a standby
//! reconnecting) starts warm. Pure: bytes in, bytes out; where they are kept and when, and the
//! exchange of digests at the handshake, belong to the runtime.
//!
//! Both ends save the same logical content when their caches agree: the block cache's pages
//! by slot with their block keys, and the tuple cache's entries oldest first. The [`digest`]
//! covers exactly that (and the parameters), so the two ends compare digests: equal, both
//! restore ([`Encoder::with_caches`], [`Decoder::with_caches`]); different (or either missing),
//! both start empty as today. A restored pair then behaves as a fresh pair whose caches are
//! already filled: new zstd contexts, a new tracker, the caches kept through the first
//! message. Nothing about the primary's pages needs to be current: cached pages are only
//! references (frames are made and read against the same bytes on both ends).
//!
//! [`digest`]: Saved::digest
//!
//! ```text
//! saved  = "WRC1" pg_major:u32 block_cache_bytes:u64
//!          nslots:u32  (key page[8192]) × nslots           -- slot 0, 1, ...
//!          ntuples:u32 (key off:u16 xmin:u32 infomask2:u16 infomask:u16 hoff:u8
//!                       len:u32 data[len]) × ntuples       -- oldest first
//!          digest:u64                                      -- xxh3-64 of all of the above
//!          norder:u32 slot:u32 × norder                     -- encoder: slots by last use,
//!                                                             most recent first; decoder: 0
//! key    = spc:u32 db:u32 rel:u32 fork:u8 blkno:u32
//! ```
//!
//! All numbers little-endian. Restoring checks the digest, the parameters (both ends and the
//! saved state must use the same `pg_major` and `block_cache_bytes`), every length against
//! what is left and the slot count against the capacity; it never panics on any bytes.
//! Saving costs the caches' size (up to `block_cache_bytes` and an eighth more) in `out`.

use twox_hash::XxHash3_64;

use super::cache::{slots_for, DecCache, EncCache, Page};
use super::streams::Reader;
use super::tuples::{Head, Tid, TupleCache};
use super::wal::{BlockKey, PAGE_SIZE};
use super::{CodecParams, Decoder, Encoder, WalCodecError};
use crate::pg::PgMajor;

const MAGIC: &[u8; 4] = b"WRC1";

/// What one end saved.
pub struct Saved {
    /// The caches and the digest of their content ([`Encoder::save_caches`]).
    pub bytes: Vec<u8>,
    /// Equal on both ends iff their caches (and parameters) are equal.
    pub digest: u64,
}

fn put_key(out: &mut Vec<u8>, k: &BlockKey) {
    for v in [k.spc, k.db, k.rel] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.push(k.fork);
    out.extend_from_slice(&k.blkno.to_le_bytes());
}

/// The shared part: parameters, slots, tuples. Returns the digest.
fn save_common<'a>(
    p: &CodecParams,
    slots: impl ExactSizeIterator<Item = (&'a BlockKey, &'a [u8; PAGE_SIZE])>,
    tuples: &TupleCache,
    out: &mut Vec<u8>,
) -> u64 {
    out.clear();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&PgMajor::to_wire(p.pg_major).to_le_bytes());
    out.extend_from_slice(&(p.block_cache_bytes as u64).to_le_bytes());
    out.extend_from_slice(&(slots.len() as u32).to_le_bytes());
    for (key, page) in slots {
        put_key(out, key);
        out.extend_from_slice(page);
    }
    let at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut n = 0u32;
    for (tid, head, data) in tuples.entries() {
        put_key(out, &tid.block);
        out.extend_from_slice(&tid.off.to_le_bytes());
        out.extend_from_slice(&head.xmin.to_le_bytes());
        out.extend_from_slice(&head.infomask2.to_le_bytes());
        out.extend_from_slice(&head.infomask.to_le_bytes());
        out.push(head.hoff);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
        n += 1;
    }
    out[at..at + 4].copy_from_slice(&n.to_le_bytes());
    let digest = XxHash3_64::oneshot(out);
    out.extend_from_slice(&digest.to_le_bytes());
    digest
}

impl Encoder {
    /// The caches as they are now (between two messages), and their digest.
    pub fn save_caches(&self) -> Saved {
        let mut bytes = Vec::new();
        let digest = save_common(&self.params, self.cache.slots(), &self.tuples, &mut bytes);
        let order = self.cache.use_order();
        bytes.extend_from_slice(&(order.len() as u32).to_le_bytes());
        for s in order {
            bytes.extend_from_slice(&s.to_le_bytes());
        }
        Saved { bytes, digest }
    }

    /// A new encoder for `p` whose caches are those of `saved` (from
    /// [`Encoder::save_caches`] with the same parameters).
    pub fn with_caches(p: &CodecParams, saved: &[u8]) -> Result<Encoder, WalCodecError> {
        let mut e = Encoder::new(p)?;
        let (slots, tuples, mut r) = load_common(p, saved)?;
        let n = u32_le(&mut r)? as usize;
        if n != slots.len() {
            return Err(bad("slots and their use order disagree"));
        }
        let mut order = Vec::with_capacity(n);
        for _ in 0..n {
            order.push(u32_le(&mut r)?);
        }
        if !r.done() {
            return Err(bad("bytes after the end"));
        }
        e.cache = EncCache::restore(slots_for(p.block_cache_bytes), slots, &order)
            .ok_or_else(|| bad("slots and their use order disagree"))?;
        e.tuples = tuples;
        e.keep_caches = true;
        Ok(e)
    }
}

impl Decoder {
    /// The caches as they are now (between two messages), and their digest; `None` if the
    /// block cache has a slot without a page (it cannot then agree with any encoder's).
    pub fn save_caches(&self) -> Option<Saved> {
        let slots: Vec<_> = self.st.cache.slots().collect::<Option<Vec<_>>>()?;
        let mut bytes = Vec::new();
        let digest = save_common(&self.params, slots.into_iter(), &self.st.tuples, &mut bytes);
        bytes.extend_from_slice(&0u32.to_le_bytes());
        Some(Saved { bytes, digest })
    }

    /// A new decoder for `p` whose caches are those of `saved` (from
    /// [`Decoder::save_caches`] with the same parameters).
    pub fn with_caches(p: &CodecParams, saved: &[u8]) -> Result<Decoder, WalCodecError> {
        let mut d = Decoder::new(p)?;
        let (slots, tuples, mut r) = load_common(p, saved)?;
        if u32_le(&mut r)? != 0 || !r.done() {
            return Err(bad("bytes after the end"));
        }
        d.st.cache = DecCache::restore(slots_for(p.block_cache_bytes), slots)
            .ok_or_else(|| bad("more slots than the cache has, or a block twice"))?;
        d.st.tuples = tuples;
        d.keep_caches = true;
        Ok(d)
    }
}

fn bad(msg: &str) -> WalCodecError {
    WalCodecError::Corrupt(format!("saved caches: {msg}"))
}

fn u32_le(r: &mut Reader<'_>) -> Result<u32, WalCodecError> {
    let b = r.bytes(4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u16_le(r: &mut Reader<'_>) -> Result<u16, WalCodecError> {
    let b = r.bytes(2)?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

fn key(r: &mut Reader<'_>) -> Result<BlockKey, WalCodecError> {
    Ok(BlockKey {
        spc: u32_le(r)?,
        db: u32_le(r)?,
        rel: u32_le(r)?,
        fork: r.u8()?,
        blkno: u32_le(r)?,
    })
}

type Loaded<'a> = (Vec<(BlockKey, Page)>, TupleCache, Reader<'a>);

/// Checks magic, parameters and digest; reads slots and tuples. The reader is left at the
/// encoder-only part.
fn load_common<'a>(p: &CodecParams, saved: &'a [u8]) -> Result<Loaded<'a>, WalCodecError> {
    let mut r = Reader::new(saved, "saved caches");
    if r.bytes(4)? != MAGIC {
        return Err(bad("not a walrelay cache file"));
    }
    if u32_le(&mut r)? != PgMajor::to_wire(p.pg_major) || r.u64()? != p.block_cache_bytes as u64 {
        return Err(bad("saved with other pg_major or block_cache_bytes"));
    }
    let cap = slots_for(p.block_cache_bytes);
    let nslots = u32_le(&mut r)? as usize;
    if nslots > cap || nslots > saved.len() / PAGE_SIZE {
        return Err(bad("more slots than fit"));
    }
    let mut slots = Vec::with_capacity(nslots);
    for _ in 0..nslots {
        let k = key(&mut r)?;
        let mut page: Page = Box::new([0; PAGE_SIZE]);
        page.copy_from_slice(r.bytes(PAGE_SIZE)?);
        slots.push((k, page));
    }
    let mut tuples = TupleCache::new(TupleCache::bytes_for(p.block_cache_bytes));
    for _ in 0..u32_le(&mut r)? {
        let block = key(&mut r)?;
        let off = u16_le(&mut r)?;
        let head = Head {
            xmin: u32_le(&mut r)?,
            infomask2: u16_le(&mut r)?,
            infomask: u16_le(&mut r)?,
            hoff: r.u8()?,
        };
        let len = u32_le(&mut r)? as usize;
        if len > PAGE_SIZE {
            return Err(bad("a tuple longer than a page"));
        }
        tuples.put(Tid { block, off }, head, r.bytes(len)?);
    }
    let covered = r.position();
    if r.u64()? != XxHash3_64::oneshot(&saved[..covered]) {
        return Err(bad("digest mismatch (damaged)"));
    }
    Ok((slots, tuples, r))
}

#[cfg(test)]
mod tests;
