//! Bad input of every kind gets a clear, typed error and loses nothing:
//! a store that is not a volume, a truncated one, an unknown format
//! version, an unknown codec id, flipped bits, a full disk, a failed sync.

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::error::{NoSpace, NotAVolume};
use squeeze_engine::{
    check::check, CreateOptions, EngineError, OpenOptions, SimFaults, SimStorage, Storage, Volume,
};
use squeeze_format::{checksum, RecordHeader, SECTOR_SIZE};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// The default policy with 64 KiB blobs: the tests below damage the record
/// holding given LBAs, so they pin the blob size instead of following the
/// default's.
fn blobs_64k() -> Option<squeeze_engine::Policy> {
    let mut p = squeeze_engine::default_policy();
    p.max_blob = 64 << 10;
    Some(p)
}

fn open(s: &Arc<SimStorage>) -> squeeze_engine::Result<Volume> {
    Volume::open(s.clone(), OpenOptions::default())
}

#[test]
fn not_a_volume_and_truncated() {
    let s = Arc::new(SimStorage::new());
    s.allocate(0, 1 << 20).unwrap();
    s.write_at(b"hello, this is a text file", 0).unwrap();
    let e = open(&s).err().expect("not a volume");
    assert!(
        matches!(e, EngineError::NotAVolume(NotAVolume::BadMagic)),
        "{e}"
    );
    assert!(e.to_string().contains("not a squeeze volume"), "{e}");

    let empty = Arc::new(SimStorage::new());
    let e = open(&empty).err().expect("empty");
    assert!(
        matches!(e, EngineError::NotAVolume(NotAVolume::ShortFile { len: 0 })),
        "{e}"
    );

    // A real volume cut short: the checkpoint and log are gone.
    let (s, v) = sim_volume(8 * MIB, None);
    v.write(0, &[7u8; 65536], true).unwrap();
    v.close().unwrap();
    let short = Arc::new(SimStorage::new());
    let mut head = vec![0u8; 8192];
    s.read_at(&mut head, 0).unwrap();
    short.allocate(0, 8192).unwrap();
    short.write_at(&head, 0).unwrap();
    let e = open(&short).err().expect("truncated");
    assert!(matches!(e, EngineError::Metadata(_)), "{e}");
}

#[test]
fn unknown_format_version() {
    let (s, v) = sim_volume(8 * MIB, None);
    v.close().unwrap();
    for slot in 0..2u64 {
        let mut b = vec![0u8; 4096];
        s.read_at(&mut b, slot * 4096).unwrap();
        b[8..12].copy_from_slice(&(squeeze_format::FORMAT_VERSION + 1).to_le_bytes());
        let crc = checksum::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        s.write_at(&b, slot * 4096).unwrap();
    }
    let e = open(&s).err().expect("version");
    let want = format!(
        "unsupported format version {}",
        squeeze_format::FORMAT_VERSION + 1
    );
    assert!(e.to_string().contains(&want), "{e}");
}

/// Finds the record of `lba` by scanning the store for its header.
fn find_record(s: &SimStorage, uuid: [u8; 16], lba: u64) -> u64 {
    let len = s.len().unwrap();
    let mut buf = vec![0u8; len as usize];
    s.read_at(&mut buf, 0).unwrap();
    let mut off = 1 << 20;
    while off + 64 <= len {
        if let Ok(h) = RecordHeader::decode(&buf[off as usize..off as usize + 64], &uuid) {
            if h.uuid == uuid && h.lba == lba && h.kind.has_payload() {
                return off;
            }
        }
        off += 16;
    }
    panic!("record for LBA {lba} not found");
}

#[test]
fn flipped_bits_fail_only_the_affected_reads_and_check_names_them() {
    let (s, v) = sim_volume(8 * MIB, blobs_64k());
    let mut r = rng(4);
    let d = data(&mut r, 3, 2 * MIB as usize);
    v.write(0, &d, true).unwrap();
    let uuid = v.uuid();
    v.close().unwrap();
    // Damage the payload of the record holding LBA 32 (sectors 32..48 with
    // 64K blobs, two 32K chunks behind a 16-byte table): byte 100 of it is
    // in the first chunk, sectors 32..40.
    let off = find_record(&s, uuid, 32);
    s.flip_bit(off + 64 + 100, 3);
    let v = open(&s).unwrap();
    let mut b = vec![0u8; SECTOR_SIZE];
    let e = v.read(32 * 4096, &mut b).expect_err("checksum error");
    assert!(matches!(e, EngineError::Corrupt { lba: 32, .. }), "{e}");
    assert_eq!(e.errno(), libc::EIO);
    // Neighbours are served.
    v.read(0, &mut b).unwrap();
    assert_eq!(&b[..], &d[..4096]);
    v.read(48 * 4096, &mut b).unwrap();
    assert_eq!(&b[..], &d[48 * 4096..49 * 4096]);
    // So is the record's other chunk (format 5).
    v.read(40 * 4096, &mut b).unwrap();
    assert_eq!(&b[..], &d[40 * 4096..41 * 4096]);
    let rep = check(&v, |_, _| {});
    assert!(!rep.is_clean());
    assert_eq!(rep.damaged.len(), 1, "{:?}", rep.damaged);
    assert_eq!(rep.damaged[0].first_lba, 32);
    assert_eq!(rep.damaged[0].sectors, 8);
    // The read of LBA 32, check's read of the record's run, then its
    // eight sectors one by one.
    assert_eq!(v.stats().checksum_errors, 10);
    // A read across the whole write fetches the adjacent records in one
    // span; the damaged one still fails it, named by its first LBA.
    let mut all = vec![0u8; d.len()];
    let e = v.read(0, &mut all).expect_err("checksum error in the span");
    assert!(matches!(e, EngineError::Corrupt { lba: 32, .. }), "{e}");
    // ... and a span that stops before it is served.
    let mut head = vec![0u8; 32 * SECTOR_SIZE];
    v.read(0, &mut head).unwrap();
    assert_eq!(head, d[..32 * SECTOR_SIZE]);
}

#[test]
fn unknown_codec_id_in_a_record_is_an_error_not_data() {
    let (s, v) = sim_volume(8 * MIB, blobs_64k());
    let mut r = rng(6);
    let d = data(&mut r, 2, 256 << 10);
    v.write(0, &d, true).unwrap();
    let uuid = v.uuid();
    v.close().unwrap();
    let off = find_record(&s, uuid, 16);
    let mut h = vec![0u8; 64];
    s.read_at(&mut h, off).unwrap();
    // A short header (this build's): codec id 7 in its 3 bits, the CRC
    // made right (over the uuid first).
    assert_eq!(&h[..2], b"sz");
    let fields = u32::from_le_bytes(h[2..6].try_into().unwrap()) | 7 << 23;
    h[2..6].copy_from_slice(&fields.to_le_bytes());
    let crc = checksum::crc32c_append(checksum::crc32c(&uuid), &h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    s.write_at(&h[..32], off).unwrap();
    let v = open(&s).unwrap();
    let mut b = vec![0u8; 4096];
    let e = v.read(16 * 4096, &mut b).expect_err("unknown codec");
    assert!(e.to_string().contains("unknown codec id 7"), "{e}");
    let rep = check(&v, |_, _| {});
    assert_eq!(rep.damaged.len(), 1);
    assert_eq!(rep.damaged[0].first_lba, 16);
}

#[test]
fn corrupt_checkpoint_is_reported() {
    let (s, v) = sim_volume(8 * MIB, None);
    v.write(0, &[1u8; 8192], true).unwrap();
    v.close().unwrap();
    let ro = Volume::open(
        s.clone(),
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    let cur = ro.superblock();
    drop(ro);
    // The chain holds a base (create) and deltas (the writes, the close).
    // A flipped bit in the last piece: the newest superblock gives way to
    // the other slot, whose chain ends before it, and the log after that
    // checkpoint is replayed: nothing lost, the damage reported.
    assert!(cur.checkpoint.len > 4096, "{:?}", cur.checkpoint);
    let seg = u64::from(cur.segment_size);
    let chain_byte =
        |pos: u64| cur.segment_offset(cur.checkpoint.segments[(pos / seg) as usize]) + pos % seg;
    let last = chain_byte(cur.checkpoint.len - 4096 + 40);
    s.flip_bit(last, 0);
    let v = Volume::open(
        s.clone(),
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .expect("the older slot's checkpoint opens it");
    let why = v.damage().superblock.clone().expect("damage reported");
    assert!(why.contains("checkpoint piece checksum mismatch"), "{why}");
    let mut b = vec![0u8; 8192];
    v.read(0, &mut b).unwrap();
    assert_eq!(b, vec![1u8; 8192]);
    assert!(!check(&v, |_, _| {}).is_clean());
    drop(v);
    s.flip_bit(last, 0);
    // A flipped bit in the base, which both slots' chains share: refused.
    s.flip_bit(chain_byte(40), 0);
    let e = open(&s).err().expect("corrupt checkpoint");
    assert!(
        e.to_string().contains("checkpoint piece checksum mismatch"),
        "{e}"
    );
    s.flip_bit(chain_byte(40), 0);
    open(&s).expect("the repaired chain opens");
}

#[test]
fn max_physical_gives_enospc_and_recovers_after_trim() {
    let s = Arc::new(SimStorage::new());
    let mut o = CreateOptions::new(64 * MIB);
    o.segment_size = 512 << 10;
    o.max_physical = 8 * MIB;
    let v = Volume::create(s.clone(), &o).unwrap();
    let mut r = rng(8);
    let (written, err) = write_until_error(&v, &mut r, 0, 64 * MIB);
    // The cap leaves too few segments: the figures say so.
    assert!(
        matches!(err, EngineError::NoSpace(NoSpace::Segments { .. })),
        "{err}"
    );
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(written >= 3 * MIB, "only {written} bytes fit");
    let st = v.stats();
    assert!(st.space_warning.is_some(), "{st:?}");
    assert_eq!(st.physical_limit_bytes, 8 * MIB);
    // Reads, flushes and trims still work.
    let mut b = vec![0u8; 4096];
    v.read(0, &mut b).unwrap();
    v.flush().unwrap();
    v.trim(0, written, false).unwrap();
    // After the trim, room comes back (dead segments are freed by a checkpoint).
    let d = data(&mut r, 1, 1 << 20);
    v.write(0, &d, true).unwrap();
    v.read(0, &mut b).unwrap();
    assert_eq!(&b[..], &d[..4096]);
    v.verify_accounting().unwrap();
    v.close().unwrap();
    let v = open(&s).unwrap();
    v.read(0, &mut b).unwrap();
    assert_eq!(&b[..], &d[..4096]);
}

#[test]
fn full_backing_disk_gives_enospc_and_stays_consistent() {
    let s = Arc::new(SimStorage::new());
    let v = Volume::create(s.clone(), &small_opts(64 * MIB)).unwrap();
    let mut r = rng(10);
    let keep = data(&mut r, 1, 1 << 20);
    v.write(0, &keep, true).unwrap();
    s.set_faults(SimFaults {
        capacity: Some(s.len().unwrap() + 2 * MIB),
        ..Default::default()
    });
    let (at, err) = write_until_error(&v, &mut r, MIB, 64 * MIB);
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    let mut b = vec![0u8; keep.len()];
    v.read(0, &mut b).unwrap();
    assert!(b == keep);
    v.flush().unwrap();
    // Free room: the disk grows (an admin deleted files); writes work again.
    s.set_faults(SimFaults::default());
    let d = data(&mut r, 1, 1 << 20);
    v.write(at, &d, true).unwrap();
    v.close().unwrap();
    let v = open(&s).unwrap();
    v.read(0, &mut b).unwrap();
    assert!(b == keep);
}

#[test]
fn failed_sync_turns_the_volume_read_only() {
    let (s, v) = sim_volume(8 * MIB, None);
    v.write(0, &[5u8; 8192], true).unwrap();
    s.set_faults(SimFaults {
        sync_eio: 1,
        ..Default::default()
    });
    v.write(8192, &[6u8; 8192], false).unwrap();
    let e = v.flush().expect_err("sync fails");
    assert!(e.to_string().contains("injected EIO"), "{e}");
    // It never pretends success afterwards.
    assert!(matches!(v.flush(), Err(EngineError::ReadOnly(_))));
    assert!(matches!(
        v.write(0, &[1], false),
        Err(EngineError::ReadOnly(_))
    ));
    let mut b = vec![0u8; 8192];
    v.read(0, &mut b).unwrap();
    assert_eq!(b, vec![5u8; 8192]);
    assert!(v.stats().read_only_reason.is_some());
    drop(v);
    // Reopening clears it; the flushed data is there.
    let v = open(&s).unwrap();
    v.read(0, &mut b).unwrap();
    assert_eq!(b, vec![5u8; 8192]);
    v.write(0, &[1], true).unwrap();
}

#[test]
fn write_eio_turns_the_volume_read_only() {
    let (s, v) = sim_volume(8 * MIB, None);
    s.set_faults(SimFaults {
        write_eio: 1,
        ..Default::default()
    });
    let mut r = rng(2);
    let d: Vec<u8> = (0..65536).map(|_| r.gen()).collect();
    assert!(v.write(0, &d, false).is_err());
    assert!(matches!(
        v.write(0, &d, false),
        Err(EngineError::ReadOnly(_))
    ));
}

/// Flips one bit in the newest superblock slot (returns its slot).
fn damage_newest_slot(s: &SimStorage) -> u64 {
    let mut b = vec![0u8; 8192];
    s.read_at(&mut b, 0).unwrap();
    let gen = |i: usize| {
        squeeze_format::Superblock::decode(&b[i * 4096..(i + 1) * 4096]).map(|x| x.generation)
    };
    let newest = match (gen(0), gen(1)) {
        (Ok(a), Ok(c)) => u64::from(c > a),
        (Ok(_), Err(_)) => 0,
        _ => 1,
    };
    s.flip_bit(newest * 4096 + 200, 1);
    newest
}

#[test]
fn a_damaged_newest_superblock_falls_back_to_the_older_slot() {
    let (s, v) = sim_volume(16 * MIB, None);
    let mut r = rng(40);
    let mut model = vec![0u8; 16 * MIB as usize];
    // Several checkpoints, overwrites (so segments get freed), then more
    // writes after the last checkpoint, flushed.
    for k in 0..6 {
        let d = data(&mut r, 3, 3 * MIB as usize);
        let off = (k % 4) * 2 * MIB;
        v.write(off, &d, false).unwrap();
        model[off as usize..off as usize + d.len()].copy_from_slice(&d);
        v.checkpoint().unwrap();
    }
    let d = data(&mut r, 1, MIB as usize);
    v.write(12 * MIB, &d, true).unwrap();
    model[12 * MIB as usize..13 * MIB as usize].copy_from_slice(&d);
    let img = Arc::new(s.kill());
    drop(v);
    damage_newest_slot(&img);
    let v = open(&img).unwrap();
    let mut back = vec![0u8; model.len()];
    v.read(0, &mut back).unwrap();
    assert!(
        back == model,
        "the older slot's checkpoint plus replay rebuilt everything"
    );
    v.verify_accounting().unwrap();
    // And after a clean close whose newest slot is damaged.
    v.close().unwrap();
    damage_newest_slot(&img);
    let v = open(&img).unwrap();
    v.read(0, &mut back).unwrap();
    assert!(back == model);
    drop(v);
    // Both slots damaged: a clear error, nothing served.
    let mut b = vec![0u8; 8192];
    img.read_at(&mut b, 0).unwrap();
    img.flip_bit(300, 0);
    img.flip_bit(4096 + 300, 0);
    let e = open(&img).err().expect("no valid superblock");
    assert!(
        e.to_string().contains("superblock checksum mismatch"),
        "{e}"
    );
}

#[test]
fn eio_on_read_fails_that_read_only() {
    let (s, v) = sim_volume(8 * MIB, None);
    v.write(0, &[3u8; 65536], true).unwrap();
    s.set_faults(SimFaults {
        read_eio: 1,
        ..Default::default()
    });
    let mut b = vec![0u8; 4096];
    let e = v.read(0, &mut b).expect_err("EIO");
    assert_eq!(e.errno(), libc::EIO);
    v.read(0, &mut b).unwrap();
    assert_eq!(b, vec![3u8; 4096]);
    v.write(0, &[4u8; 4096], true).unwrap();
}

#[test]
fn a_short_write_turns_read_only_and_loses_nothing_flushed() {
    let (s, v) = sim_volume(8 * MIB, None);
    v.write(0, &[1u8; 65536], true).unwrap();
    s.set_faults(SimFaults {
        short_writes: 1,
        ..Default::default()
    });
    let mut r = rng(41);
    let d: Vec<u8> = (0..65536).map(|_| r.gen()).collect();
    assert!(v.write(65536, &d, false).is_err());
    assert!(matches!(
        v.write(0, &[2u8; 4096], false),
        Err(EngineError::ReadOnly(_))
    ));
    let img = Arc::new(s.kill());
    drop(v);
    let v = open(&img).unwrap();
    let mut b = vec![0u8; 65536];
    v.read(0, &mut b).unwrap();
    assert_eq!(b, vec![1u8; 65536]);
    v.read(65536, &mut b).unwrap();
    assert!(b == vec![0u8; 65536] || b == d, "no invented bytes");
}
