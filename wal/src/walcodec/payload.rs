//! The payload's framing: which sections a message has and where they are (format version 3).
//!
//! ```text
//! payload  = separate | combined
//! separate = 0x03 present:u8 clen:varint × (sections present) section × (present) FPI-bytes
//!            present: bit s (0..=6) set when stream s (CTRL, HDR, DATA, RAW, IMG, PAGE, MAIN)
//!            has bytes this message, bit 7 when there are page frames (FPI); each present
//!            stream's section is `clen` bytes of its own streaming zstd context, flushed
//!            (ZSTD_e_flush); the FPI bytes are the rest of the payload (bit 7 set iff any)
//! combined = 0x13 clen:varint chunk FPI-bytes
//!            chunk: `clen` bytes of the COMBINED streaming zstd context, flushed, which
//!            decompress to ulen:varint × 7 then the 7 streams' bytes in order; FPI as above
//! ```
//!
//! A message whose streams got fewer than [`COMBINED_MAX`] bytes goes combined: one flush
//! instead of up to seven, no section sizes outside the compressed chunk. Measured with a
//! message per commit (steady, payload / zstd-3): pgbench 0.502 → 0.449, random-payload
//! updates 0.690 → 0.663; 20 ms batches unchanged (bigger messages compress better kept
//! apart, by kind, in their own contexts: all combined was 6 % worse there). The decoder
//! follows the mode byte; each context only ever sees the messages of its mode.
//!
//! Decompressed sizes are capped before anything is allocated (the encoder's output always
//! meets the caps): CTRL 4 × raw_len + 1024, PAGE 8 × raw_len + 8192, the others raw_len; the
//! combined chunk their sum plus 70 bytes of lengths.

use super::streams::{put_varint, CStream, DStream, Reader};
use super::wal::PAGE_SIZE;
use super::{WalCodecError, FORMAT_VERSION, STREAMS, STREAM_NAMES, S_CTRL, S_PAGE};

pub const SEPARATE: u8 = FORMAT_VERSION;
pub const COMBINED: u8 = 0x10 | FORMAT_VERSION;
/// Messages whose streams' input is below this go combined.
pub const COMBINED_MAX: usize = 4 * 1024;

/// The largest number of bytes stream `s` may restore to for a message of `raw_len` bytes.
pub fn cap(s: usize, raw_len: usize) -> usize {
    match s {
        S_CTRL => raw_len.saturating_mul(4).saturating_add(1024),
        S_PAGE => raw_len.saturating_mul(8).saturating_add(PAGE_SIZE),
        _ => raw_len,
    }
}

/// Writes the payload of one message: the streams' gathered bytes (cleared), then `fpi`.
/// `clens` gets each stream's share of the payload (the combined chunk is shared out by
/// input bytes), for the counters.
pub fn write(
    streams: &mut [CStream],
    combined: &mut CStream,
    fpi: &[u8],
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
    clens: &mut [usize; STREAMS],
) -> Result<(), WalCodecError> {
    let ulens: Vec<usize> = streams.iter().map(|s| s.buf.len()).collect();
    let total: usize = ulens.iter().sum();
    if total < COMBINED_MAX {
        out.push(COMBINED);
        let buf = &mut combined.buf;
        buf.clear();
        for u in &ulens {
            put_varint(buf, *u as u64);
        }
        for s in streams.iter_mut() {
            buf.extend_from_slice(&s.buf);
            s.buf.clear();
        }
        scratch.clear();
        combined.flush_into(scratch)?;
        put_varint(out, scratch.len() as u64);
        out.extend_from_slice(scratch);
        for (c, u) in clens.iter_mut().zip(&ulens) {
            *c = (scratch.len() * u).checked_div(total).unwrap_or(0);
        }
    } else {
        out.push(SEPARATE);
        let mut present = u8::from(!fpi.is_empty()) << 7;
        for (s, u) in ulens.iter().enumerate() {
            present |= u8::from(*u > 0) << s;
        }
        out.push(present);
        scratch.clear();
        for (s, stream) in streams.iter_mut().enumerate() {
            let before = scratch.len();
            stream.flush_into(scratch)?;
            clens[s] = scratch.len() - before;
            if ulens[s] > 0 {
                put_varint(out, clens[s] as u64);
            }
        }
        out.extend_from_slice(scratch);
    }
    out.extend_from_slice(fpi);
    Ok(())
}

/// The decoder's side: restores the sections of `payload` into `bufs` (one per stream;
/// `scratch` holds a combined chunk); returns the page frames (FPI bytes).
pub fn read<'a>(
    payload: &'a [u8],
    raw_len: usize,
    streams: &mut [DStream],
    combined: &mut DStream,
    scratch: &mut Vec<u8>,
    bufs: &mut [Vec<u8>],
) -> Result<&'a [u8], WalCodecError> {
    let mut hdr = Reader::new(payload, "payload header");
    match hdr.u8()? {
        SEPARATE => {
            let present = hdr.u8()?;
            let mut clens = [0usize; STREAMS];
            for (s, c) in clens.iter_mut().enumerate() {
                if present & (1 << s) != 0 {
                    *c = hdr.len(payload.len())?;
                }
            }
            let mut rest = payload.get(hdr.position()..).unwrap_or(&[]);
            for (s, &clen) in clens.iter().enumerate() {
                bufs[s].clear();
                if present & (1 << s) == 0 {
                    continue;
                }
                let chunk = rest.get(..clen).ok_or_else(|| {
                    corrupt(format!("the {} section is cut short", STREAM_NAMES[s]))
                })?;
                rest = &rest[clen..];
                let (name, cap) = (STREAM_NAMES[s], cap(s, raw_len));
                streams[s].decode_capped(chunk, cap, &mut bufs[s], name)?;
            }
            if (present & 0x80 != 0) == rest.is_empty() {
                return Err(corrupt("page frames present or absent against the header"));
            }
            Ok(rest)
        }
        COMBINED => {
            let clen = hdr.len(payload.len())?;
            let rest = payload.get(hdr.position()..).unwrap_or(&[]);
            let chunk = rest
                .get(..clen)
                .ok_or_else(|| corrupt("the combined section is cut short"))?;
            let all = (0..STREAMS)
                .map(|s| cap(s, raw_len))
                .fold(10 * STREAMS, usize::saturating_add);
            combined.decode_capped(chunk, all, scratch, "combined")?;
            let mut r = Reader::new(scratch, "combined");
            let mut ulens = [0usize; STREAMS];
            for (s, u) in ulens.iter_mut().enumerate() {
                *u = r.len(cap(s, raw_len))?;
            }
            for (buf, &u) in bufs.iter_mut().zip(&ulens) {
                buf.clear();
                buf.extend_from_slice(r.bytes(u)?);
            }
            if !r.done() {
                return Err(corrupt("the combined section has bytes left over"));
            }
            Ok(&rest[clen..])
        }
        v => Err(corrupt(format!(
            "payload format byte 0x{v:02x}, this decoder reads version 3 (0x{SEPARATE:02x}, \
             0x{COMBINED:02x})"
        ))),
    }
}

fn corrupt(msg: impl Into<String>) -> WalCodecError {
    WalCodecError::Corrupt(msg.into())
}
