//! Where a commit's backing bytes go, and what smaller encodings would
//! save: replays the writes `squeeze wal bench` makes (1 thread, db_bench-
//! like payloads: half random bytes, half a repeat of them) without a
//! volume, and prices each engine record in today's format and in the
//! encodings proposed for issue 37 item 3 (docs/benchmarks.md, "Sparse
//! WAL"). Nothing here is a format: it is the arithmetic behind choosing one.
//!
//! ```sh
//! cargo run --release -p squeeze-wal --example commit_bytes [COMMITS]
//! ```
//!
//! The engine's price of a write of whole sectors is what `squeeze wal
//! bench` counts as backing bytes: one record, `align16(header + payload)`,
//! the payload one zstd:3 frame with its content size (what `squeeze-codec`
//! writes), stored raw when the frame is over 7/8 of the sectors (the
//! default required ratio). The engine encodings priced beside it:
//!
//! - **block**: today's 32-byte short header; the payload of a one-sector
//!   record is the body of one compressed zstd block of the sector's bytes
//!   up to its last non-zero one (the rest zeros), its frame's magic, frame
//!   header and block header implied (a header bit would say so);
//! - **tiny20**: that payload behind a 20-byte header (tag 1, stored length
//!   2, seq 8, LBA 5, one CRC-32C over the volume's uuid, those bytes and
//!   the payload 4);
//! - **tiny16**: the same with the seq's low 32 bits only (16 bytes).
//!
//! Where a sector does not compress to one such block, today's record.
//! squeeze-wal's record header, priced as it goes through zstd:
//!
//! - **v1**: version 1's 40 bytes (magic, CRC, log id, seq, group, epoch,
//!   len), what logs created before issue 37 keep;
//! - **v2**: version 2 as built (`record_v2`, what `Wal::create` writes):
//!   flags, CRC seeded with the log id, seq and epoch, length, and for the
//!   first record of a group the seq's low 8 bits (7 bytes for a 128-byte
//!   commit; the first record of an open also stores the epoch);
//! - **v2min**: flags (1), CRC (4) over the log id, seq and epoch (implied)
//!   and the rest, the payload length in as few bytes as it needs (the
//!   proposal's floor: a probe for later groups could check nothing);
//! - **v2seq**: v2min with the epoch's low byte and the seq's low 32 bits
//!   (the proposal that stores more than was built).

use rand::Rng;
use squeeze_wal::record::RecordHeader;
use squeeze_wal::record_v2::RecordHeaderV2;
use zstd::zstd_safe::{self, CParameter};

const SECTOR: usize = 4096;
const SHORT_HEADER: usize = 32;

fn align16(n: usize) -> usize {
    n.next_multiple_of(16)
}

/// A payload like `squeeze wal bench`'s (db_bench's values).
fn payload(r: &mut impl Rng, len: usize) -> Vec<u8> {
    let half: Vec<u8> = (0..len.div_ceil(2)).map(|_| r.gen()).collect();
    let mut p = half.clone();
    p.extend_from_slice(&half);
    p.truncate(len);
    p
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Wal {
    V1,
    V2,
    V2Min,
    V2Seq,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Engine {
    Today,
    Block,
    Tiny20,
    Tiny16,
}

fn encode_record(w: Wal, log_id: u64, seq: u64, p: &[u8], out: &mut Vec<u8>) {
    if w == Wal::V1 {
        return RecordHeader {
            log_id,
            seq,
            group: seq,
            epoch: 2,
            len: p.len() as u32,
        }
        .encode_into(p, out);
    }
    if w == Wal::V2 {
        // One record a group (1 thread); the first of the run stores the epoch.
        return RecordHeaderV2::new(p.len() as u32, seq, 2, true, seq == 0)
            .encode_into(log_id, seq, 2, p, out);
    }
    let len = (p.len() as u32).to_le_bytes();
    let len_bytes = (4 - (p.len() as u32).leading_zeros() as usize / 8).max(1);
    let start = out.len();
    out.push(0x40 | len_bytes as u8); // group = seq, length bytes
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&len[..len_bytes]);
    if w == Wal::V2Seq {
        out.push(2); // epoch's low byte
        out.extend_from_slice(&(seq as u32).to_le_bytes());
    }
    out.extend_from_slice(p);
    let mut c = crc32c::crc32c(&log_id.to_le_bytes());
    c = crc32c::crc32c_append(c, &seq.to_le_bytes());
    c = crc32c::crc32c_append(c, &out[start..]);
    out[start + 1..start + 5].copy_from_slice(&c.to_le_bytes());
}

fn zstd3(src: &[u8], content_size: bool) -> Vec<u8> {
    let mut c = zstd_safe::CCtx::create();
    c.set_parameter(CParameter::CompressionLevel(3)).unwrap();
    c.set_parameter(CParameter::ContentSizeFlag(content_size))
        .unwrap();
    let mut out = vec![0u8; zstd_safe::compress_bound(src.len())];
    let n = c.compress2(&mut out[..], src).unwrap();
    out.truncate(n);
    out
}

/// The engine record of a write of whole sectors today: (record bytes,
/// frame bytes).
fn today(run: &[u8]) -> (usize, usize) {
    let f = zstd3(run, true);
    let stored = if f.len() * 8 <= run.len() * 7 {
        f.len()
    } else {
        run.len()
    };
    (align16(SHORT_HEADER + stored), f.len())
}

/// The frame header a block body is decoded behind: magic, a frame header
/// without content size, checksum or dictionary (window 4 KiB), and the
/// header of one last compressed block of `n` bytes.
fn implied_frame_header(n: usize) -> [u8; 9] {
    let mut h = [0u8; 9];
    h[..4].copy_from_slice(&0xFD2F_B528u32.to_le_bytes());
    h[4] = 0x00;
    h[5] = (12 - 10) << 3;
    let bh = 1 | (2 << 1) | ((n as u32) << 3);
    h[6..9].copy_from_slice(&bh.to_le_bytes()[..3]);
    h
}

/// The body of the one compressed zstd block a one-sector write becomes
/// (its bytes up to the last non-zero one), checked to decode back behind
/// the implied header; `None` where the sector is not one such block.
fn block_body(sector: &[u8]) -> Option<Vec<u8>> {
    assert_eq!(sector.len(), SECTOR);
    let end = sector.iter().rposition(|&b| b != 0)? + 1;
    let f = zstd3(&sector[..end], false);
    let bh = u32::from_le_bytes([f[6], f[7], f[8], 0]);
    let (last, kind, n) = (bh & 1, (bh >> 1) & 3, (bh >> 3) as usize);
    if f[4] != 0 || f[5] > (12 - 10) << 3 || last != 1 || kind != 2 || n + 9 != f.len() {
        return None;
    }
    let body = f[9..].to_vec();
    let mut frame = implied_frame_header(body.len()).to_vec();
    frame.extend_from_slice(&body);
    let mut out = vec![0u8; SECTOR];
    let got = zstd_safe::DCtx::create()
        .decompress(&mut out[..], &frame)
        .expect("the implied frame decodes");
    assert_eq!(&out[..got], &sector[..end]);
    (body.len() < SECTOR).then_some(body)
}

/// A write of whole sectors in engine encoding `e`: record bytes.
fn price(e: Engine, run: &[u8]) -> usize {
    let header = match e {
        Engine::Today => return today(run).0,
        Engine::Block => SHORT_HEADER,
        Engine::Tiny20 => 20,
        Engine::Tiny16 => 16,
    };
    if run.len() == SECTOR {
        if let Some(body) = block_body(run) {
            return align16(header + body.len()).min(today(run).0);
        }
    }
    today(run).0
}

const ENGINES: [Engine; 4] = [Engine::Today, Engine::Block, Engine::Tiny20, Engine::Tiny16];

/// The writes of `commits` one-record commits, as squeeze-wal's
/// `plan_group` lays them out: record bytes per commit in each engine
/// encoding, and frame bytes per engine write today.
fn replay(dense: bool, w: Wal, size: usize, commits: u64, r: &mut impl Rng) -> ([f64; 4], f64) {
    let log_id = r.gen::<u64>() | 1;
    let mut bytes = [0usize; 4];
    let (mut frames, mut writes) = (0, 0);
    let mut pos = 0usize; // area offset of the tail
    let mut image: Vec<u8> = Vec::new(); // dense: the tail sector's bytes before the tail
    for seq in 0..commits {
        let p = payload(r, size);
        if !dense && !pos.is_multiple_of(SECTOR) {
            pos = pos.next_multiple_of(SECTOR);
            image.clear();
        }
        let start = pos / SECTOR * SECTOR;
        let mut buf = image.clone();
        encode_record(w, log_id, seq, &p, &mut buf);
        pos = start + buf.len();
        let whole = buf.len() / SECTOR * SECTOR;
        image = if dense {
            buf[whole..].to_vec()
        } else {
            Vec::new()
        };
        buf.resize(buf.len().next_multiple_of(SECTOR), 0);
        // The engine cuts a write into blobs of up to 32 sectors; these are
        // one or two sectors.
        for run in buf.chunks(32 * SECTOR) {
            for (k, e) in ENGINES.into_iter().enumerate() {
                bytes[k] += price(e, run);
            }
            frames += today(run).1;
            writes += 1;
        }
    }
    let n = commits as f64;
    (bytes.map(|b| b as f64 / n), frames as f64 / writes as f64)
}

/// One sparse commit of 128 bytes in record version `w`, field by field.
fn breakdown(w: Wal, r: &mut impl Rng) {
    let p = payload(r, 128);
    let mut rec = Vec::new();
    encode_record(w, r.gen::<u64>() | 1, 1000, &p, &mut rec);
    let header = rec.len() - p.len();
    let mut sector = rec.clone();
    sector.resize(SECTOR, 0);
    let f = zstd3(&sector, true);
    let fhd = f[4];
    let fcs = [usize::from(fhd >> 5 & 1), 2, 4, 8][usize::from(fhd >> 6)];
    let frame_header = 1 + usize::from(fhd >> 5 & 1 == 0) + fcs;
    let block = 4 + frame_header;
    let lit_header = if f[block + 3] >> 2 & 3 == 1 { 2 } else { 1 };
    let lits = (usize::from(f[block + 3]) >> 4) | (usize::from(f[block + 4]) << 4);
    let seqs = f.len() - block - 3 - lit_header - lits;
    let rec_bytes = today(&sector).0;
    println!(
        "one sparse commit of 128 B, squeeze-wal {}: {rec_bytes} record bytes (engine format 5's)",
        format!("{w:?}").to_lowercase()
    );
    println!("  engine short header            {SHORT_HEADER:>3}");
    println!("  zstd magic                       4");
    println!("  zstd frame header              {frame_header:>3}  (content size {fcs} B)");
    println!("  zstd block header                3");
    println!("  zstd literals header           {lit_header:>3}");
    println!(
        "  literals                       {lits:>3}  (64 random payload bytes, {} of squeeze-wal's {header}-byte header)",
        lits - 64
    );
    println!("  sequences                      {seqs:>3}  (the payload's repeat, the header's, the zeros)");
    println!(
        "  alignment padding              {:>3}",
        rec_bytes - SHORT_HEADER - f.len()
    );
    let body = block_body(&sector).expect("one block");
    println!(
        "  block body of the sector up to its last non-zero byte: {} (the frame less {})",
        body.len(),
        f.len() - body.len()
    );
    println!(
        "  engine format 6 (block payload): {} record bytes",
        align16(SHORT_HEADER + body.len())
    );
    println!();
}

fn main() {
    let commits: u64 = std::env::args()
        .nth(1)
        .map_or(4000, |s| s.parse().expect("COMMITS"));
    let mut r = rand::thread_rng();
    breakdown(Wal::V1, &mut r);
    breakdown(Wal::V2, &mut r);
    println!(
        "backing bytes per commit, 1 thread, {commits} commits (dense / sparse: sparse's fewer bytes)"
    );
    println!(
        "{:>5} {:>6}  {:>24} {:>24} {:>24} {:>24}",
        "bytes", "wal", "engine today", "block", "tiny20", "tiny16"
    );
    for size in [128usize, 256, 512, 1024, 2048] {
        for w in [Wal::V1, Wal::V2, Wal::V2Min, Wal::V2Seq] {
            let (d, _) = replay(true, w, size, commits, &mut r);
            let (s, _) = replay(false, w, size, commits, &mut r);
            let cells: Vec<String> = (0..4)
                .map(|k| {
                    format!(
                        "{:.1} / {:.1}: {:.1}%",
                        d[k],
                        s[k],
                        100.0 * (1.0 - s[k] / d[k])
                    )
                })
                .collect();
            println!(
                "{size:>5} {:>6}  {:>24} {:>24} {:>24} {:>24}",
                format!("{w:?}").to_lowercase(),
                cells[0],
                cells[1],
                cells[2],
                cells[3]
            );
        }
    }
}
