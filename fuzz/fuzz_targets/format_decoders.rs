//! Every on-disk decoder of squeeze-format on arbitrary bytes: record
//! headers (and payload verification), superblock slots, format 1
//! checkpoint streams and their chunks, format 2 checkpoint chains (pieces
//! and their runs, and a piece streamed through `PieceDecoder`, which must
//! agree with the whole-piece decoder). Bytes from disk must never panic a decoder, and what
//! decodes must re-encode to something that decodes to the same value.
//!
//! Input: one mode byte, then the bytes handed to every decoder. Mode bits
//! let the fuzzer past the checksums and framing into the validation logic
//! (random bytes almost never carry a right CRC-32C):
//! - bit 0: recompute the record header CRC (a full header: bytes 60..64;
//!   a short one, whose bytes start `sz`: 28..32, over the uuid
//!   [`RECORD_UUID`] first);
//! - bit 1: zero-pad to 4 KiB and recompute the superblock CRC (4092..4096);
//! - bit 2: take the checkpoint's expected uuid from its own bytes 16..32;
//! - bit 3: rewrite the checkpoint's chunk count to fit the length;
//! - bit 4: pad to 4 KiB and set the first piece's length (72..80) and CRC
//!   (68..72) to fit;
//! - bits 5..8: the size of the slices the piece is streamed in.

#![no_main]

use libfuzzer_sys::fuzz_target;
use squeeze_format::checkpoint::{pieces, Piece, PIECE_ALIGN, PIECE_HEADER_SIZE};
use squeeze_format::checkpoint_v1::{CheckpointReader, CHECKPOINT_HEADER_SIZE, CHUNK_BYTES};
use squeeze_format::checksum::{crc32c, crc32c_append};
use squeeze_format::record::{verify_payload, SHORT_MAGIC};
use squeeze_format::{
    MapEntry, PieceDecoder, RecordHeader, Superblock, RECORD_HEADER_SIZE, SHORT_HEADER_SIZE,
    SUPERBLOCK_SIZE,
};

/// The volume uuid record headers are decoded for (gen-corpus's).
const RECORD_UUID: [u8; 16] = [0x5a; 16];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    record(mode, bytes);
    superblock(mode, bytes);
    checkpoint(mode, bytes);
    chain(mode, bytes);
});

fn chain(mode: u8, bytes: &[u8]) {
    let mut b = bytes.to_vec();
    let uuid: [u8; 16] = if mode & 4 != 0 && b.len() >= 32 {
        b[16..32].try_into().expect("16 bytes")
    } else {
        [0; 16]
    };
    if mode & 16 != 0 && b.len() >= PIECE_HEADER_SIZE {
        let len = (b.len() as u64).div_ceil(PIECE_ALIGN) * PIECE_ALIGN;
        b.resize(len as usize, 0);
        b[72..80].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c_append(crc32c_append(crc32c(&b[..68]), &[0; 4]), &b[72..]);
        b[68..72].copy_from_slice(&crc.to_le_bytes());
    }
    streamed(mode, &b, &uuid);
    let mut at = 0u64;
    for piece in pieces(&b, &uuid) {
        let Ok(p) = piece else {
            return;
        };
        at += p.len;
        assert!(at <= b.len() as u64);
        let mut seen = 0;
        for run in p.runs() {
            let Ok(r) = run else {
                break;
            };
            seen += 1;
            for i in 0..r.sectors.min(64) {
                let e = r.entry(i);
                let _ = (e.record_offset(), e.index(), e.sectors(), e.stored_share());
            }
        }
        assert!(seen <= p.run_count());
    }
}

/// The first piece fed to `PieceDecoder` in slices (their size from the
/// mode's top bits) decodes exactly when `Piece::decode` takes it whole
/// and all its runs check, to the same runs.
fn streamed(mode: u8, b: &[u8], uuid: &[u8; 16]) {
    let slice = 1 + usize::from(mode >> 5) * 37;
    let mut d = PieceDecoder::new(*uuid);
    let mut got = Vec::new();
    let mut at = 0usize;
    let mut fed = Ok(());
    while d.remaining() > 0 && at < b.len() && fed.is_ok() {
        let n = (d.remaining() as usize).min(slice).min(b.len() - at);
        fed = d.feed(&b[at..at + n], |r| got.push(r));
        at += n;
    }
    let streamed = fed.and_then(|()| d.finish());
    let whole = Piece::decode(b, uuid)
        .and_then(|p| Ok((p.runs().collect::<Result<Vec<_>, _>>()?, p.header, p.crc)));
    match (streamed, whole) {
        (Ok(head), Ok((runs, header, crc))) => {
            assert_eq!(got, runs);
            assert_eq!((head.header, head.crc), (header, crc));
        }
        (Err(_), Err(_)) => {}
        (s, w) => panic!(
            "streamed {:?}, whole {:?}",
            s.map(|h| h.crc),
            w.map(|w| w.2)
        ),
    }
}

fn record(mode: u8, bytes: &[u8]) {
    let mut b = bytes.to_vec();
    if mode & 1 != 0 && b.len() >= SHORT_HEADER_SIZE && b.starts_with(&SHORT_MAGIC) {
        let crc = crc32c_append(crc32c(&RECORD_UUID), &b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
    } else if mode & 1 != 0 && b.len() >= RECORD_HEADER_SIZE {
        let crc = crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(h) = RecordHeader::decode(&b, &RECORD_UUID) else {
        return;
    };
    let _ = h.record_len();
    let _ = h.raw_len();
    let payload = &b[h.header_len()..];
    let _ = verify_payload(&h, payload);
    let _ = verify_payload(&h, &payload[..payload.len().min(h.stored_len as usize)]);
    let mut out = [0u8; RECORD_HEADER_SIZE];
    h.encode(&mut out);
    assert_eq!(
        RecordHeader::decode(&out[..h.header_len()], &RECORD_UUID).expect("re-encoded header"),
        h
    );
}

fn superblock(mode: u8, bytes: &[u8]) {
    let mut b = bytes.to_vec();
    if mode & 2 != 0 {
        if b.len() < SUPERBLOCK_SIZE {
            b.resize(SUPERBLOCK_SIZE, 0);
        }
        let crc = crc32c(&b[..SUPERBLOCK_SIZE - 4]);
        b[SUPERBLOCK_SIZE - 4..SUPERBLOCK_SIZE].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(sb) = Superblock::decode(&b) else {
        return;
    };
    let _ = (sb.slot(), sb.sectors(), sb.segment_offset(u32::MAX));
    let enc = sb.encode();
    assert_eq!(enc.len(), SUPERBLOCK_SIZE);
    assert_eq!(Superblock::decode(&enc).expect("re-encoded superblock"), sb);
}

fn checkpoint(mode: u8, bytes: &[u8]) {
    let mut b = bytes.to_vec();
    let uuid: [u8; 16] = if mode & 4 != 0 && b.len() >= 32 {
        b[16..32].try_into().expect("16 bytes")
    } else {
        [0; 16]
    };
    if mode & 8 != 0 && b.len() >= CHECKPOINT_HEADER_SIZE {
        let counters = u32::from_le_bytes(b[64..68].try_into().expect("4 bytes")) as usize;
        let counters_end = CHECKPOINT_HEADER_SIZE.saturating_add(counters.saturating_mul(8));
        if let Some(rest) = b.len().checked_sub(counters_end) {
            let chunks = rest / CHUNK_BYTES;
            b.truncate(counters_end + chunks * CHUNK_BYTES);
            b[56..64].copy_from_slice(&(chunks as u64).to_le_bytes());
        }
    }
    let Ok(r) = CheckpointReader::decode(&b, &uuid) else {
        return;
    };
    let _ = (&r.header, r.counters.len(), r.chunk_count());
    let mut seen = 0;
    for chunk in r.chunks() {
        let Ok((_index, entries)) = chunk else {
            continue;
        };
        seen += 1;
        for e in entries.iter().copied().filter(|e: &MapEntry| e.is_mapped()) {
            let _ = (e.record_offset(), e.index(), e.sectors(), e.record_len());
            let _ = e.stored_share();
        }
    }
    assert!(seen <= r.chunk_count());
}
