//! What `ssh -C` would carry for the same WAL: the baseline users ask about beside `zstd -3`
//! ("how many bytes does my link carry, compared with `zstd -3` or `ssh -C`?").
//!
//! A stream forwarded through `ssh -C -L` (OpenSSH, `packet.c`, `channels.c`) goes as
//! channel-data packets of at most [`PACKET`] bytes (`CHAN_TCP_PACKET_DEFAULT`, also
//! `CHANNEL_MAX_READ`). Each packet's payload is
//!
//! ```text
//! payload = 94:u8 (SSH_MSG_CHANNEL_DATA) recipient:u32 len:u32 data
//! ```
//!
//! compressed by one zlib stream per direction at level 6 (`start_compression_out(ssh, 6)`),
//! flushed with `Z_PARTIAL_FLUSH` after each packet. On the wire, with the default cipher
//! (chacha20-poly1305, 8-byte blocks, the length not encrypted):
//!
//! ```text
//! packet = length:u32 padlen:u8 compressed-payload padding[padlen] mac[16]
//!          padlen = 8 - ((1 + compressed) mod 8), plus 8 when that is under 4
//! ```
//!
//! [`SshC`] does exactly that with zlib itself (the `flate2` crate's zlib backend, as OpenSSH
//! links it) and counts the packets' bytes. It is a best case for ssh: the packets are full
//! (a stream reaching ssh faster than it sends; a slower one is flushed more often, in
//! smaller packets), and only the WAL goes through it, not the replication protocol's
//! headers, keepalives or the standby's replies, nor TCP's acknowledgements, all of which the
//! bench counts for walrelay on its link socket.

use anyhow::{ensure, Context, Result};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

use super::payloads::Payloads;

/// Most data bytes in one channel-data packet.
pub const PACKET: usize = 32 * 1024;
/// zlib level OpenSSH compresses with.
pub const LEVEL: u32 = 6;
/// SSH_MSG_CHANNEL_DATA, the recipient channel, the data's length: compressed with the data.
const CHANNEL_DATA_HEADER: usize = 9;
const SSH_MSG_CHANNEL_DATA: u8 = 94;
/// chacha20-poly1305's block and tag.
const BLOCK: usize = 8;
const MAC: usize = 16;

/// Bytes on the wire of one packet whose compressed payload is `compressed` bytes.
pub fn packet_len(compressed: usize) -> usize {
    let len = 1 + compressed;
    let mut pad = BLOCK - len % BLOCK;
    if pad < 4 {
        pad += BLOCK;
    }
    4 + len + pad + MAC
}

/// One direction of an `ssh -C` connection forwarding a stream.
pub struct SshC {
    z: Compress,
    /// Bytes on the wire so far.
    pub wire_bytes: u64,
    /// A packet's payload before compression, and after.
    plain: Vec<u8>,
    packed: Vec<u8>,
}

impl Default for SshC {
    fn default() -> SshC {
        SshC::new()
    }
}

impl SshC {
    pub fn new() -> SshC {
        SshC {
            z: Compress::new(Compression::new(LEVEL), true),
            wire_bytes: 0,
            plain: Vec::with_capacity(CHANNEL_DATA_HEADER + PACKET),
            packed: Vec::new(),
        }
    }

    /// Sends `data` (what one read of the forwarded socket returned) as packets; `keep`, when
    /// given, gets each packet's compressed payload.
    pub fn send(&mut self, data: &[u8], mut keep: Option<&mut Payloads>) -> Result<()> {
        for chunk in data.chunks(PACKET) {
            self.packet(chunk)?;
            if let Some(k) = keep.as_deref_mut() {
                k.push(&self.packed);
            }
        }
        Ok(())
    }

    /// One packet: its payload compressed and flushed, its wire bytes counted.
    fn packet(&mut self, data: &[u8]) -> Result<()> {
        self.plain.clear();
        self.plain.push(SSH_MSG_CHANNEL_DATA);
        self.plain.extend_from_slice(&0u32.to_be_bytes());
        self.plain
            .extend_from_slice(&(data.len() as u32).to_be_bytes());
        self.plain.extend_from_slice(data);
        self.packed.clear();
        let mut input = &self.plain[..];
        loop {
            self.packed.reserve(input.len() / 2 + 64);
            let before = self.z.total_in();
            self.z
                .compress_vec(input, &mut self.packed, FlushCompress::Partial)
                .context("zlib deflate")?;
            input = &input[(self.z.total_in() - before) as usize..];
            // Flushed once all input is in and zlib left room in the output.
            if input.is_empty() && self.packed.len() < self.packed.capacity() {
                break;
            }
        }
        self.wire_bytes += packet_len(self.packed.len()) as u64;
        Ok(())
    }
}

/// The receiving end: inflates each packet's payload and returns its data.
pub struct SshCReceiver {
    z: Decompress,
    plain: Vec<u8>,
}

impl Default for SshCReceiver {
    fn default() -> SshCReceiver {
        SshCReceiver::new()
    }
}

impl SshCReceiver {
    pub fn new() -> SshCReceiver {
        SshCReceiver {
            z: Decompress::new(true),
            plain: Vec::with_capacity(CHANNEL_DATA_HEADER + PACKET),
        }
    }

    /// The data of the packet whose compressed payload is `packed`.
    pub fn receive(&mut self, packed: &[u8]) -> Result<&[u8]> {
        self.plain.clear();
        let mut input = packed;
        while !input.is_empty() {
            self.plain.reserve(CHANNEL_DATA_HEADER + PACKET);
            let before = self.z.total_in();
            let st = self
                .z
                .decompress_vec(input, &mut self.plain, FlushDecompress::Sync)
                .context("zlib inflate")?;
            let used = (self.z.total_in() - before) as usize;
            // Room for a whole packet's data was there: no progress means a bad stream.
            ensure!(used > 0, "zlib inflate made no progress ({st:?})");
            input = &input[used..];
        }
        ensure!(
            self.plain.len() >= CHANNEL_DATA_HEADER && self.plain[0] == SSH_MSG_CHANNEL_DATA,
            "not a channel-data packet"
        );
        let len = u32::from_be_bytes(self.plain[5..9].try_into()?) as usize;
        ensure!(
            self.plain.len() == CHANNEL_DATA_HEADER + len,
            "a packet's data is {} bytes, its header says {len}",
            self.plain.len() - CHANNEL_DATA_HEADER
        );
        Ok(&self.plain[CHANNEL_DATA_HEADER..])
    }
}

/// Bytes `ssh -C` puts on the wire for `wal`, read from its socket `read` bytes at a time.
pub fn wire_bytes(wal: &[u8], read: usize) -> Result<u64> {
    let mut s = SshC::new();
    for chunk in wal.chunks(read.max(1)) {
        s.send(chunk, None)?;
    }
    Ok(s.wire_bytes)
}

/// [`wire_bytes`] of the WAL in `file`, read [`PACKET`] bytes at a time (full packets).
pub fn file_wire_bytes(file: &std::path::Path) -> Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut s = SshC::new();
    let mut buf = Vec::with_capacity(64 * PACKET);
    loop {
        buf.clear();
        (&mut f)
            .take(64 * PACKET as u64)
            .read_to_end(&mut buf)
            .with_context(|| format!("reading {}", file.display()))?;
        if buf.is_empty() {
            return Ok(s.wire_bytes);
        }
        s.send(&buf, None)?;
    }
}

/// [`file_wire_bytes`] on a blocking thread, for async callers (as `walrange::zstd_size` is).
pub async fn file_size(file: &std::path::Path) -> Result<u64> {
    let file = file.to_path_buf();
    tokio::task::spawn_blocking(move || file_wire_bytes(&file)).await?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// WAL-like bytes: repeated records with a counter, some noise.
    fn sample(n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n);
        let mut x = 0x1234_5678u32;
        while v.len() < n {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            v.extend_from_slice(b"INSERT tuple header ");
            v.extend_from_slice(&(v.len() as u32).to_le_bytes());
            v.extend_from_slice(&x.to_le_bytes()[..2]);
        }
        v.truncate(n);
        v
    }

    #[test]
    fn padding_follows_openssh() {
        // 1 + compressed bytes, padded to 8 with at least 4 of padding.
        assert_eq!(packet_len(3), 4 + 4 + 4 + 16);
        assert_eq!(packet_len(4), 4 + 5 + 11 + 16);
        assert_eq!(packet_len(7), 4 + 8 + 8 + 16);
        for c in 0..64 {
            let pad = packet_len(c) - 4 - 1 - c - MAC;
            assert!((4..4 + BLOCK).contains(&pad), "{c}: {pad}");
            assert_eq!((1 + c + pad) % BLOCK, 0, "{c}");
        }
    }

    /// Every packet decompresses on its own, in order, to its data: each is flushed.
    #[test]
    fn every_packet_is_flushed_and_round_trips() {
        let wal = sample(300_000);
        let mut s = SshC::new();
        let mut packets = Payloads::with_room(0, 0);
        for chunk in wal.chunks(100_000) {
            s.send(chunk, Some(&mut packets)).unwrap();
        }
        // 100,000 bytes a read: three full packets and one of 1,696 bytes, three times.
        assert_eq!(packets.len(), 12);
        let mut r = SshCReceiver::new();
        let mut back = Vec::new();
        for p in packets.iter() {
            back.extend_from_slice(r.receive(p).unwrap());
        }
        assert_eq!(back, wal);
        let on_wire: usize = packets.iter().map(|p| packet_len(p.len())).sum();
        assert_eq!(s.wire_bytes, on_wire as u64);
        assert!(s.wire_bytes < wal.len() as u64 / 2, "{}", s.wire_bytes);
    }

    /// Smaller reads mean more packets, flushes and framing: never fewer bytes.
    #[test]
    fn smaller_reads_cost_more() {
        let wal = sample(200_000);
        let full = wire_bytes(&wal, PACKET).unwrap();
        let small = wire_bytes(&wal, 1024).unwrap();
        assert!(small > full, "{small} vs {full}");
        // Incompressible bytes come out a little larger than they went in.
        let mut noise = vec![0u8; 100_000];
        let mut x = 7u64;
        for b in noise.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let n = wire_bytes(&noise, PACKET).unwrap();
        assert!(n > 100_000 && n < 101_000, "{n}");
    }

    /// A file is read in full packets: the bytes [`wire_bytes`] counts for them.
    #[test]
    fn a_file_counts_as_its_bytes_in_full_packets() {
        let wal = sample(5 * 64 * PACKET + 1000);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.wal");
        std::fs::write(&path, &wal).unwrap();
        assert_eq!(
            file_wire_bytes(&path).unwrap(),
            wire_bytes(&wal, PACKET).unwrap()
        );
    }

    #[test]
    fn a_corrupt_payload_is_an_error() {
        let mut s = SshC::new();
        let mut packets = Payloads::with_room(0, 0);
        s.send(&sample(5000), Some(&mut packets)).unwrap();
        let mut bad = packets.get(0).unwrap().to_vec();
        bad[0] ^= 0xff;
        assert!(SshCReceiver::new().receive(&bad).is_err());
    }
}
