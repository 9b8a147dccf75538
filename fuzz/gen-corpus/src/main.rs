//! Writes the committed seed corpus: a handful of valid inputs per fuzz
//! target, built with the real encoders (so they track the format).
//!
//! Run from fuzz/: `CARGO_TARGET_DIR=/work/target-fuzz cargo run
//! --manifest-path gen-corpus/Cargo.toml -- corpus` (overwrites the seed
//! files it names; files libFuzzer added are left alone).

use std::path::{Path, PathBuf};

use squeeze_codec::testdata::{fio_like, random, text};
use squeeze_codec::{new_compressor, Algorithm, CodecId};
use squeeze_format::checksum::crc32c;
use squeeze_format::checkpoint_v1::{CheckpointHeader, CheckpointWriter};
use squeeze_format::{
    CheckpointRef, CompressionMode, MapEntry, MapRun, PieceHeader, PieceKind, PieceWriter, Policy,
    HeaderForm, RecordHeader, RecordKind, SegmentNote, Superblock, CHUNK_ENTRIES, FORMAT_VERSION,
};
use squeeze_nbd::proto::*;

fn main() {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    format_decoders(&root.join("format_decoders"));
    codec_decompress(&root.join("codec_decompress"));
    nbd_stream(&root.join("nbd_stream"));
    engine_ops(&root.join("engine_ops"));
    volume_damage(&root.join("volume_damage"));
}

/// The damage matrix's cases (crates/squeeze-engine/tests/damage_matrix.rs)
/// as `volume_damage` inputs, on the clean and on the crashed image: each
/// superblock slot zeroed, randomised and partly zeroed, a flush mark slot,
/// 4 KiB of random bytes in the middle of each of the first segments (the
/// checkpoint and the log), bit flips, and the file cut at a segment
/// boundary and inside a record.
fn volume_damage(dir: &Path) {
    const SEG: u32 = 512 << 10;
    const DATA_START: u32 = 1 << 20;
    // [op, off (u24 LE), len (u16 LE), val, 0]
    let op = |code: u8, off: u32, len: u16, val: u8| -> [u8; 8] {
        let o = off.to_le_bytes();
        let l = len.to_le_bytes();
        [code, o[0], o[1], o[2], l[0], l[1], val, 0]
    };
    const FILL: u8 = 0;
    const RANDOM: u8 = 0x10;
    const FLIP: u8 = 1;
    const CUT: u8 = 2;
    let mut cases: Vec<(String, Vec<[u8; 8]>)> = Vec::new();
    for slot in 0..2u32 {
        let at = slot * 4096;
        cases.push((format!("superblock{slot}-zeroed"), vec![op(FILL, at, 4096, 0)]));
        cases.push((format!("superblock{slot}-random"), vec![op(RANDOM, at, 4096, 7)]));
        cases.push((format!("superblock{slot}-partly-zeroed"), vec![op(FILL, at + 64, 512, 0)]));
        cases.push((format!("flush-mark{slot}"), vec![op(FILL, 8192 + at, 4096, 0xa5)]));
    }
    for seg in 0..6u32 {
        let mid = DATA_START + seg * SEG + SEG / 2;
        cases.push((format!("segment{seg}-middle"), vec![op(RANDOM, mid, 4096, seg as u8)]));
        cases.push((format!("segment{seg}-flip"), vec![op(FLIP, mid + 100, 0, 3)]));
    }
    cases.push(("cut-at-a-segment".into(), vec![op(CUT, SEG, 0, 0)]));
    cases.push(("cut-inside-a-record".into(), vec![op(CUT, 1000, 0, 0)]));
    cases.push((
        "both-superblocks".into(),
        vec![op(FILL, 0, 4096, 0), op(RANDOM, 4096, 4096, 9)],
    ));
    for (image, first) in [("clean", 0u8), ("crashed", 1u8)] {
        for (name, ops) in &cases {
            let mut v = vec![first];
            for o in ops {
                v.extend_from_slice(o);
            }
            put(dir, &format!("{image}-{name}"), &v);
        }
    }
}

fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
}

fn with_mode(mode: u8, b: &[u8]) -> Vec<u8> {
    let mut v = vec![mode];
    v.extend_from_slice(b);
    v
}

const UUID: [u8; 16] = [0x5a; 16];

fn superblock(clean: bool, segments: Vec<u32>) -> Superblock {
    Superblock {
        version: FORMAT_VERSION,
        uuid: UUID,
        generation: 7,
        logical_size: 1 << 30,
        segment_size: 32 << 20,
        max_physical: 0,
        policy: Policy {
            codec: CodecId::Zstd,
            level: 3,
            mode: CompressionMode::Aggressive,
            required_ratio_ppm: 875_000,
            min_blob: 4096,
            max_blob: 64 << 10,
            recompress_codec: CodecId::Deflate,
            recompress_level: 9,
            read_chunk: 32 << 10,
        },
        created_unix: 1_700_000_000,
        clean,
        checkpoint: CheckpointRef {
            len: 4256,
            crc: 0x1234_5678,
            segments,
        },
    }
}

fn record(kind: RecordKind, codec: CodecId, sectors: u32, payload: &[u8]) -> Vec<u8> {
    record_in(HeaderForm::Full, kind, codec, sectors, payload)
}

fn record_in(
    form: HeaderForm,
    kind: RecordKind,
    codec: CodecId,
    sectors: u32,
    payload: &[u8],
) -> Vec<u8> {
    let h = RecordHeader {
        kind,
        codec,
        seq: 42,
        uuid: UUID,
        lba: 1000,
        sectors,
        stored_len: payload.len() as u32,
        aux: match (kind, form) {
            (RecordKind::Relocate, _) => 1 << 20,
            (_, HeaderForm::Short) => 0,
            _ => 3,
        },
        payload_crc: if payload.is_empty() {
            0
        } else {
            crc32c(payload)
        },
        chunk_sectors: 0,
        block: false,
        form,
    };
    let mut b = vec![0u8; h.header_len()];
    h.encode(&mut b);
    b.extend_from_slice(payload);
    b
}

fn checkpoint(uuid: [u8; 16], chunks: &[u64]) -> Vec<u8> {
    let h = CheckpointHeader {
        uuid,
        generation: 7,
        next_seq: 1000,
        head_offset: (1 << 20) + 4096,
    };
    let mut w = CheckpointWriter::new(&h, &[1, 2, 3, 4], chunks.len());
    let mut entries = [MapEntry::UNMAPPED; CHUNK_ENTRIES];
    for (i, e) in entries.iter_mut().enumerate().step_by(7) {
        let sectors = 1 + (i as u32 % 32);
        *e = MapEntry::new((1 << 20) + 16 * i as u64, i as u32 % sectors, sectors, 4160);
    }
    for &c in chunks {
        w.push_chunk(c, &entries);
    }
    w.finish()
}

/// A format 2 chain: a base and a delta.
fn chain(uuid: [u8; 16]) -> Vec<u8> {
    let header = |kind, generation| PieceHeader {
        kind,
        uuid,
        generation,
        next_seq: 1000,
        head_offset: (1 << 20) + 4096,
    };
    let run = |lba, sectors, offset| MapRun {
        lba,
        sectors,
        first: if offset == 0 {
            MapEntry::UNMAPPED
        } else {
            MapEntry::new(offset, 0, 32, 32 * 4096 + 64)
        },
    };
    let mut w = PieceWriter::new(&header(PieceKind::Base, 7), &[1, 2, 3, 4], &[], 3);
    w.push(run(0, 32, 1 << 20));
    w.push(run(32, 16, 2 << 20));
    w.push(run(600, 32, 3 << 20));
    let mut b = w.finish();
    let mut w = PieceWriter::new(
        &header(PieceKind::Delta, 8),
        &[5, 6, 7, 8],
        &[SegmentNote {
            segment: 2,
            below_target_bytes: 4096,
        }],
        2,
    );
    w.push(run(10, 3, 0));
    w.push(run(600, 32, 4 << 20));
    b.extend(w.finish());
    b
}

fn format_decoders(dir: &Path) {
    put(dir, "chain", &with_mode(4, &chain(UUID)));
    put(
        dir,
        "superblock",
        &with_mode(0, &superblock(false, vec![3, 4]).encode()),
    );
    put(
        dir,
        "superblock-clean",
        &with_mode(0, &superblock(true, vec![9]).encode()),
    );
    // A short superblock the mode bit pads and checksums.
    let mut short = superblock(false, vec![1]).encode();
    short.truncate(200);
    put(dir, "superblock-fixcrc", &with_mode(2, &short));
    let comp = compressed(CodecId::Lz4, &text(8192, 1));
    put(
        dir,
        "record-extent-lz4",
        &with_mode(0, &record(RecordKind::Extent, CodecId::Lz4, 2, &comp)),
    );
    put(
        dir,
        "record-extent-raw",
        &with_mode(
            1,
            &record(RecordKind::Extent, CodecId::None, 1, &random(4096, 2)),
        ),
    );
    put(
        dir,
        "record-short-extent",
        &with_mode(
            0,
            &record_in(HeaderForm::Short, RecordKind::Extent, CodecId::Lz4, 2, &comp),
        ),
    );
    put(
        dir,
        "record-short-relocate",
        &with_mode(
            1,
            &record_in(HeaderForm::Short, RecordKind::Relocate, CodecId::Lz4, 2, &comp),
        ),
    );
    // A chunked raw extent (format 5): 8 sectors in chunks of 4, its table
    // first; the payload CRC is the table's.
    {
        let raw = random(8 * 4096, 3);
        let (table, crc) = squeeze_format::chunks::raw_table(&raw, 4);
        let mut payload = table;
        payload.extend_from_slice(&raw);
        let h = RecordHeader {
            kind: RecordKind::Extent,
            codec: CodecId::None,
            seq: 42,
            uuid: UUID,
            lba: 1000,
            sectors: 8,
            stored_len: payload.len() as u32,
            aux: 0,
            payload_crc: crc,
            chunk_sectors: 4,
            block: false,
            form: HeaderForm::Short,
        };
        let mut b = vec![0u8; h.header_len()];
        h.encode(&mut b);
        b.extend_from_slice(&payload);
        put(dir, "record-chunked-raw", &with_mode(0, &b));
    }
    // A Link record (format 7): 40 client sectors to hidden addresses.
    {
        let h = RecordHeader {
            kind: RecordKind::Link,
            codec: CodecId::None,
            seq: 43,
            uuid: UUID,
            lba: 2000,
            sectors: 40,
            stored_len: 0,
            aux: squeeze_format::SHARED_BASE + 77,
            payload_crc: 0,
            chunk_sectors: 0,
            block: false,
            form: HeaderForm::Full,
        };
        let mut b = vec![0u8; h.header_len()];
        h.encode(&mut b);
        put(dir, "record-link", &with_mode(0, &b));
    }
    // A block payload (format 6): a WAL commit's sector as zstd's block.
    {
        let mut sector = text(128, 5);
        sector.resize(4096, 0);
        let mut body = Vec::new();
        let made = new_compressor(Algorithm::parse("zstd:3").unwrap())
            .compress_block(&sector, &mut body, 4095)
            .unwrap();
        assert!(matches!(made, squeeze_codec::BlockOutcome::Body(_)));
        let h = RecordHeader {
            kind: RecordKind::Extent,
            codec: CodecId::Zstd,
            seq: 42,
            uuid: UUID,
            lba: 1000,
            sectors: 1,
            stored_len: body.len() as u32,
            aux: 0,
            payload_crc: crc32c(&body),
            chunk_sectors: 0,
            block: true,
            form: HeaderForm::Short,
        };
        let mut b = vec![0u8; h.header_len()];
        h.encode(&mut b);
        b.extend_from_slice(&body);
        put(dir, "record-block", &with_mode(0, &b));
    }
    put(
        dir,
        "record-relocate",
        &with_mode(0, &record(RecordKind::Relocate, CodecId::Lz4, 2, &comp)),
    );
    put(
        dir,
        "record-zero",
        &with_mode(0, &record(RecordKind::Zero, CodecId::None, 32, &[])),
    );
    put(
        dir,
        "record-segment-header",
        &with_mode(1, &record(RecordKind::SegmentHeader, CodecId::None, 0, &[])),
    );
    put(
        dir,
        "checkpoint-empty",
        &with_mode(0, &checkpoint([0; 16], &[])),
    );
    put(
        dir,
        "checkpoint-2-chunks",
        &with_mode(4, &checkpoint(UUID, &[0, 5])),
    );
    put(
        dir,
        "checkpoint-fixcount",
        &with_mode(12, &checkpoint(UUID, &[1])),
    );
}

fn compressed(codec: CodecId, data: &[u8]) -> Vec<u8> {
    if codec == CodecId::None {
        return data.to_vec();
    }
    let mut out = Vec::new();
    new_compressor(Algorithm::new(codec, 0))
        .compress(data, &mut out, usize::MAX)
        .unwrap()
        .unwrap();
    out
}

fn codec_decompress(dir: &Path) {
    let inputs = [
        ("text4k", text(4096, 3)),
        ("fio60-8k", fio_like(8192, 60, 512, 4)),
        ("zeros4k", vec![0u8; 4096]),
        ("short", b"squeeze squeeze squeeze".to_vec()),
    ];
    for codec in CodecId::ALL {
        for (name, data) in &inputs {
            let mut b = (data.len() as u32).to_le_bytes()[..3].to_vec();
            b.extend_from_slice(&compressed(codec, data));
            put(dir, &format!("{}-{name}", codec.name()), &b);
        }
    }
    // Block payloads (format 6): a commit-like sector, and text.
    let mut commit = text(128, 6);
    commit.resize(4096, 0);
    for (name, data) in [("commit4k", commit), ("text8k", text(8192, 7))] {
        let mut body = Vec::new();
        let made = new_compressor(Algorithm::parse("zstd:3").unwrap())
            .compress_block(&data, &mut body, usize::MAX)
            .unwrap();
        assert!(matches!(made, squeeze_codec::BlockOutcome::Body(_)));
        let mut b = (data.len() as u32).to_le_bytes()[..3].to_vec();
        b.extend_from_slice(&body);
        put(dir, &format!("block-{name}"), &b);
    }
}

/// Client byte streams for nbd_stream.
struct Nbd(Vec<u8>);

impl Nbd {
    fn new(client_flags: u32) -> Nbd {
        Nbd(client_flags.to_be_bytes().to_vec())
    }
    fn opt(mut self, opt: u32, data: &[u8]) -> Nbd {
        self.0.extend_from_slice(&IHAVEOPT.to_be_bytes());
        self.0.extend_from_slice(&opt.to_be_bytes());
        self.0.extend_from_slice(&(data.len() as u32).to_be_bytes());
        self.0.extend_from_slice(data);
        self
    }
    fn go(self, name: &str, infos: &[u16]) -> Nbd {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        self.opt(OPT_GO, &d)
    }
    fn meta(self, opt: u32, name: &str, queries: &[&str]) -> Nbd {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        self.opt(opt, &d)
    }
    fn req(mut self, cmd: u16, flags: u16, offset: u64, len: u32, data: &[u8]) -> Nbd {
        self.0.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        self.0.extend_from_slice(&flags.to_be_bytes());
        self.0.extend_from_slice(&cmd.to_be_bytes());
        self.0.extend_from_slice(&(offset ^ 0xc0c0).to_be_bytes()); // cookie
        self.0.extend_from_slice(&offset.to_be_bytes());
        self.0.extend_from_slice(&len.to_be_bytes());
        self.0.extend_from_slice(data);
        self
    }
    fn io(self) -> Nbd {
        self.req(CMD_WRITE, 0, 4096, 512, &[0xab; 512])
            .req(CMD_WRITE, CMD_FLAG_FUA, 100, 7, b"squeeze")
            .req(CMD_READ, 0, 0, 8192, &[])
            .req(CMD_FLUSH, 0, 0, 0, &[])
            .req(CMD_TRIM, 0, 0, 4096, &[])
            .req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 8192, 4096, &[])
            .req(CMD_BLOCK_STATUS, 0, 0, 1 << 20, &[])
            .req(CMD_READ, CMD_FLAG_DF, 0, 4096, &[])
            .req(CMD_DISC, 0, 0, 0, &[])
    }
}

fn nbd_stream(dir: &Path) {
    let flags = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
    let full = Nbd::new(flags)
        .opt(OPT_STRUCTURED_REPLY, &[])
        .meta(OPT_SET_META_CONTEXT, "mem", &[META_BASE_ALLOCATION])
        .go("mem", &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION])
        .io();
    put(dir, "structured-go-io", &full.0);
    put(dir, "simple-go-io", &Nbd::new(flags).go("mem", &[]).io().0);
    put(
        dir,
        "export-name-io",
        &Nbd::new(FLAG_C_FIXED_NEWSTYLE)
            .opt(OPT_EXPORT_NAME, b"mem")
            .io()
            .0,
    );
    put(
        dir,
        "read-only-export",
        &Nbd::new(flags).go("ro", &[]).io().0,
    );
    let probe = Nbd::new(flags)
        .opt(OPT_LIST, &[])
        .go_info("", &[INFO_EXPORT])
        .meta(OPT_LIST_META_CONTEXT, "mem", &["base:"])
        .opt(OPT_STARTTLS, &[])
        .opt(0x7777, b"unknown")
        .opt(OPT_ABORT, &[]);
    put(dir, "options-abort", &probe.0);
    let bad = Nbd::new(flags)
        .go("mem", &[])
        .req(CMD_READ, 0, (1 << 20) - 1, 2, &[])
        .req(CMD_WRITE, CMD_FLAG_REQ_ONE, 0, 1, b"x")
        .req(CMD_CACHE, 0, 0, 1, &[])
        .req(99, 0, 0, 0, &[])
        .req(CMD_WRITE, 0, 0, BLOCK_SIZE_MAX + 1, &[1, 2, 3]);
    put(dir, "bad-requests", &bad.0);
}

impl Nbd {
    fn go_info(self, name: &str, infos: &[u16]) -> Nbd {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        self.opt(OPT_INFO, &d)
    }
}

/// One engine_ops operation: [op, off (u24 LE), len (u24 LE), arg].
fn op(code: u8, off: u32, len: u32, arg: u8) -> [u8; 8] {
    let o = off.to_le_bytes();
    let l = len.to_le_bytes();
    [code, o[0], o[1], o[2], l[0], l[1], l[2], arg]
}

const WRITE: u8 = 0;
const READ: u8 = 1;
const TRIM: u8 = 2;
const ZERO: u8 = 3;
const FLUSH: u8 = 4;
const CKPT: u8 = 5;
const REOPEN: u8 = 6;
const CLEAN: u8 = 7;
const POLICY: u8 = 8;
const STATUS: u8 = 9;

fn engine_ops(dir: &Path) {
    let seq = |policy: u8, ops: &[[u8; 8]]| {
        let mut v = vec![policy];
        for o in ops {
            v.extend_from_slice(o);
        }
        v
    };
    // policy byte: codec = b % 5 (none, lz4, zstd, snappy, deflate), mode = b / 5 % 4.
    let lz4_aggressive = 1 + 5 * 2;
    put(
        dir,
        "write-read-reopen",
        &seq(
            lz4_aggressive,
            &[
                op(WRITE, 0, 65536, 3),
                op(READ, 0, 65536, 0),
                op(WRITE, 4096, 5000, 2 | 8),
                op(READ, 0, 16384, 0),
                op(TRIM, 8192, 16384, 0),
                op(READ, 0, 131072, 0),
                op(FLUSH, 0, 0, 0),
                op(CKPT, 0, 0, 0),
                op(REOPEN, 0, 0, 0),
                op(STATUS, 0, 1 << 20, 255),
            ],
        ),
    );
    let zstd_force = 2 + 5 * 3;
    put(
        dir,
        "overwrite-clean-policy",
        &seq(
            zstd_force,
            &[
                op(WRITE, 0, 262144, 4),
                op(WRITE, 12345, 100000, 5),
                op(WRITE, 0, 262144, 7),
                op(TRIM, 0, 131072, 8),
                op(CKPT, 0, 0, 0),
                op(CLEAN, 0, 0, 0),
                op(READ, 0, 262144, 0),
                op(POLICY, 0x21, 0, 4),
                op(WRITE, 700000, 200000, 6 | 16),
                op(REOPEN, 0, 0, 0),
                op(READ, 600000, 262144, 0),
            ],
        ),
    );
    // The same data (kind 3, seed 1, 64 KiB) at three places, one of them
    // overwritten in part, then a deduplication pass, a reopen and reads.
    let zstd_aggressive = 2 + 5 * 2;
    put(
        dir,
        "dedup-copies",
        &seq(
            zstd_aggressive,
            &[
                op(WRITE, 0, 65536, 3 | 64),
                op(WRITE, 524288, 65536, 3 | 64),
                op(WRITE, 800000, 65536, 3 | 64),
                op(FLUSH, 0, 0, 0),
                op(CLEAN, 0, 0, 2 | 1),
                op(WRITE, 524288 + 8192, 4096, 1),
                op(READ, 524288, 65536, 0),
                op(REOPEN, 0, 0, 0),
                op(TRIM, 0, 65536, 0),
                op(CLEAN, 0, 0, 2),
                op(READ, 0, 1 << 20, 0),
            ],
        ),
    );
    let snappy_passive = 3 + 5;
    put(
        dir,
        "unaligned-zeroes",
        &seq(
            snappy_passive,
            &[
                op(WRITE, 1, 1, 1),
                op(WRITE, 4095, 2, 3 | 32),
                op(WRITE, 10000, 30000, 0),
                op(ZERO, 5000, 10000, 8),
                op(STATUS, 0, 65536, 2),
                op(READ, 0, 65536, 0),
                op(WRITE, (1 << 20) - 3, 3, 2),
                op(READ, (1 << 20) - 4096, 4096, 0),
            ],
        ),
    );
    let none = 0;
    put(
        dir,
        "uncompressed",
        &seq(
            none,
            &[
                op(WRITE, 0, 8192, 2),
                op(POLICY, 1, 0, 11),
                op(WRITE, 4096, 8192, 3),
                op(REOPEN, 0, 0, 0),
                op(READ, 0, 16384, 0),
            ],
        ),
    );
}
