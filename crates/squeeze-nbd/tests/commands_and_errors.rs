//! Every transmission command through a hand-written client, with simple
//! and with structured replies, and every error the protocol layer or the
//! device can produce: range (EINVAL, ENOSPC for writes), over-long
//! requests, unknown commands and flags, FAST_ZERO unsupported, device
//! errors mapped to EIO/ENOSPC/EPERM/ENOTSUP/EINVAL, BLOCK_STATUS with and
//! without REQ_ONE, OFFSET_HOLE reads, pipelined requests, stats.

mod common;

use std::io::{ErrorKind, Write};
use std::sync::Arc;

use common::*;

const SIZE: u64 = 8 << 20;

fn basic_commands(structured: bool) {
    let (srv, dev) = TestServer::mem(SIZE);
    let mut c = srv.client();
    let (size, flags) = c.handshake("mem", structured, structured);
    assert_eq!(size, SIZE);
    assert_eq!(flags & FLAG_READ_ONLY, 0);

    // WRITE (+FUA), READ back, unaligned.
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(c.write(4095, &data), 0);
    assert_eq!(c.cmd(CMD_WRITE, CMD_FLAG_FUA, 100_000, 3, b"fua"), 0);
    assert_eq!(c.read(4095, data.len() as u32).unwrap(), data);
    assert_eq!(c.read(100_000, 3).unwrap(), b"fua");
    // FLUSH.
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);
    // TRIM frees whole pages and reads back zeros.
    assert_eq!(c.cmd(CMD_TRIM, CMD_FLAG_FUA, 0, 16384, &[]), 0);
    assert_eq!(c.read(4095, 10_000).unwrap(), vec![0; 10_000]);
    assert_eq!(dev.allocated_bytes(), 4096, "only the page at 100000 stays");
    // WRITE_ZEROES with NO_HOLE allocates, without it punches.
    assert_eq!(
        c.cmd(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 1 << 20, 8192, &[]),
        0
    );
    assert_eq!(dev.allocated_bytes(), 3 * 4096);
    assert_eq!(
        c.cmd(
            CMD_WRITE_ZEROES,
            CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA,
            1 << 20,
            8192,
            &[]
        ),
        0
    );
    assert_eq!(dev.allocated_bytes(), 4096);
    assert_eq!(c.read(1 << 20, 8192).unwrap(), vec![0; 8192]);

    // Range errors: EINVAL for reads/trims, ENOSPC for writes past the end.
    assert_eq!(c.read(SIZE, 1), Err(EINVAL));
    assert_eq!(c.read(SIZE - 1, 2), Err(EINVAL));
    assert_eq!(c.read(u64::MAX, 1), Err(EINVAL));
    assert_eq!(c.write(SIZE - 2, b"abc"), ENOSPC);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, SIZE, 1, &[]), ENOSPC);
    assert_eq!(c.cmd(CMD_TRIM, 0, SIZE, 4096, &[]), EINVAL);
    assert_eq!(c.cmd(CMD_TRIM, 0, 0, 0, &[]), EINVAL);
    // The ENOSPC write's payload was consumed: the stream is in sync.
    assert_eq!(c.read(100_000, 3).unwrap(), b"fua");
    // Unknown command, CACHE (not advertised), bad flags.
    assert_eq!(c.cmd(42, 0, 0, 1, &[]), EINVAL);
    assert_eq!(c.cmd(CMD_CACHE, 0, 0, 1, &[]), EINVAL);
    assert_eq!(c.cmd(CMD_FLUSH, CMD_FLAG_FUA, 0, 0, &[]), EINVAL);
    assert_eq!(c.cmd(CMD_TRIM, CMD_FLAG_NO_HOLE, 0, 1, &[]), EINVAL);
    assert_eq!(c.cmd(CMD_WRITE, CMD_FLAG_REQ_ONE, 0, 2, b"xy"), EINVAL);
    assert_eq!(
        c.read(0, 2).unwrap(),
        vec![0, 0],
        "rejected write not applied"
    );
    assert_eq!(c.cmd(CMD_FLUSH, 0, 1, 0, &[]), EINVAL);

    if structured {
        // BLOCK_STATUS: hole, data, hole; REQ_ONE gives one descriptor.
        c.send_request(CMD_BLOCK_STATUS, 0, 1, 94208, 3 * 4096, &[]);
        let Reply::Chunk(ch) = c.reply(None) else {
            panic!("chunk expected")
        };
        assert_eq!(ch.kind, REPLY_TYPE_BLOCK_STATUS);
        let descs: Vec<(u32, u32)> = ch.payload[4..]
            .chunks(8)
            .map(|d| (be32(d), be32(&d[4..])))
            .collect();
        assert_eq!(descs, vec![(4096, 3), (4096, 0), (4096, 3)]);
        c.send_request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 2, 94208, 3 * 4096, &[]);
        let Reply::Chunk(ch) = c.reply(None) else {
            panic!("chunk expected")
        };
        assert_eq!(ch.payload.len(), 4 + 8);
        // READ of a hole comes back as OFFSET_HOLE (checked in Client::read);
        // with DF it is still a single chunk.
        c.send_request(CMD_READ, CMD_FLAG_DF, 3, 0, 4096, &[]);
        let Reply::Chunk(ch) = c.reply(None) else {
            panic!("chunk expected")
        };
        assert_eq!(
            (ch.kind, ch.flags),
            (REPLY_TYPE_OFFSET_HOLE, REPLY_FLAG_DONE)
        );
        // Errors are ERROR chunks.
        c.send_request(CMD_READ, 0, 4, SIZE, 1, &[]);
        let Reply::Chunk(ch) = c.reply(None) else {
            panic!("chunk expected")
        };
        assert_eq!((ch.kind, ch.cookie), (REPLY_TYPE_ERROR, 4));
        assert_eq!(be32(&ch.payload), EINVAL);
        let msg_len = be16(&ch.payload[4..]) as usize;
        assert_eq!(ch.payload.len(), 6 + msg_len);
        assert_eq!(c.cmd(CMD_BLOCK_STATUS, 0, 0, 0, &[]), EINVAL);
    } else {
        // No structured replies: BLOCK_STATUS and DF are refused.
        assert_eq!(c.cmd(CMD_BLOCK_STATUS, 0, 0, 4096, &[]), EINVAL);
        assert_eq!(c.cmd(CMD_READ, CMD_FLAG_DF, 0, 1, &[]), EINVAL);
    }

    let st = srv.server.stats();
    assert_eq!(st.connections_open, 1);
    assert!(st.requests.write >= 4 && st.requests.read >= 5 && st.requests.other == 2);
    assert!(st.bytes_written >= data.len() as u64 + 3);
    assert!(st.errors >= 10);
    c.disconnect();
}

#[test]
fn commands_with_simple_replies() {
    basic_commands(false);
}

#[test]
fn commands_with_structured_replies() {
    basic_commands(true);
}

#[test]
fn oversized_requests_on_a_large_export() {
    let (srv, _dev) = TestServer::mem(1 << 40);
    let mut c = srv.client();
    c.handshake("mem", true, true);
    // READ over 32 MiB: EINVAL. WRITE over 32 MiB: payload skipped, EINVAL.
    assert_eq!(c.read(0, (32 << 20) + 1), Err(EINVAL));
    let big = vec![0x5au8; (32 << 20) + 4096];
    assert_eq!(c.cmd(CMD_WRITE, 0, 0, big.len() as u32, &big), EINVAL);
    // Exactly 32 MiB is fine.
    assert_eq!(c.write(0, &big[..32 << 20]), 0);
    assert_eq!(c.read((32 << 20) - 2, 2).unwrap(), vec![0x5a, 0x5a]);
    // TRIM and WRITE_ZEROES may exceed the maximum block size.
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 0, u32::MAX, &[]), 0);
    assert_eq!(c.cmd(CMD_TRIM, 0, 0, u32::MAX, &[]), 0);
    assert_eq!(c.read(0, 16).unwrap(), vec![0; 16]);
    c.disconnect();
}

#[test]
fn device_errors_map_to_errnos() {
    let dev = Arc::new(FaultyDevice::new(1 << 20));
    let srv = TestServer::start(vec![export("f", dev.clone())]);
    for structured in [false, true] {
        let mut c = srv.client();
        c.handshake("f", structured, structured);
        assert_eq!(c.write(0, b"ok"), 0);
        for (kind, errno) in [
            (ErrorKind::InvalidData, EIO), // checksum failures look like this
            (ErrorKind::Other, EIO),
            (ErrorKind::StorageFull, ENOSPC),
            (ErrorKind::PermissionDenied, EPERM),
            (ErrorKind::ReadOnlyFilesystem, EPERM),
            (ErrorKind::Unsupported, ENOTSUP),
            (ErrorKind::InvalidInput, EINVAL),
        ] {
            dev.fail_with(Some(kind));
            assert_eq!(c.write(0, b"no"), errno, "{kind:?}");
            assert_eq!(c.read(0, 2), Err(errno), "{kind:?}");
            assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0, &[]), errno);
            assert_eq!(c.cmd(CMD_TRIM, 0, 0, 4096, &[]), errno);
            assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 0, 4096, &[]), errno);
            if structured {
                assert_eq!(c.cmd(CMD_BLOCK_STATUS, 0, 0, 4096, &[]), errno);
            }
        }
        dev.fail_with(None);
        // The device cannot fast-zero: FAST_ZERO is refused up front.
        assert_eq!(
            c.cmd(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 4096, &[]),
            ENOTSUP
        );
        assert_eq!(c.read(0, 2).unwrap(), b"ok");
        c.disconnect();
    }
}

#[test]
fn pipelined_requests_all_answered() {
    let (srv, _dev) = TestServer::mem(SIZE);
    let mut c = srv.client();
    c.handshake("mem", true, false);
    // 200 writes sent before reading any reply, then 200 reads.
    let mut batch = Vec::new();
    for i in 0..200u64 {
        let data = vec![i as u8; 4096];
        batch.extend_from_slice(&Client::request_bytes(CMD_WRITE, 0, i, i * 4096, 4096));
        batch.extend_from_slice(&data);
    }
    let mut writer = c.s.try_clone().unwrap();
    let t = std::thread::spawn(move || writer.write_all(&batch).unwrap());
    let mut seen = [false; 200];
    for _ in 0..200 {
        let r = c.reply(None);
        assert_eq!(r.errno(), 0);
        assert!(!std::mem::replace(&mut seen[r.cookie() as usize], true));
    }
    t.join().unwrap();
    for i in 0..200u64 {
        c.send_request(CMD_READ, 0, 1000 + i, i * 4096, 4096, &[]);
    }
    for _ in 0..200 {
        let Reply::Chunk(ch) = c.reply(None) else {
            panic!("chunk expected")
        };
        assert_eq!(ch.kind, REPLY_TYPE_OFFSET_DATA);
        let i = ch.cookie - 1000;
        assert_eq!(be64(&ch.payload), i * 4096);
        assert!(ch.payload[8..].iter().all(|&b| b == i as u8));
    }
    c.disconnect();
    let st = srv.server.stats();
    assert_eq!(st.bytes_written, 200 * 4096);
    assert_eq!(st.requests_in_flight, 0);
}

/// Writes of every size around the server's large-write path (a payload
/// from 32 KiB on is read from the socket straight into its buffer, and so
/// is the header after it), pipelined with flushes and sent in fragments
/// that cut headers and payloads anywhere: every reply comes, every byte
/// lands where it was written.
#[test]
fn pipelined_writes_of_every_size_in_fragments() {
    let (srv, _dev) = TestServer::mem(SIZE);
    let mut c = srv.client();
    c.handshake("mem", true, false);
    let sizes = [
        128 << 10,
        4096,
        64 << 10,
        (32 << 10) - 1,
        32 << 10,
        1,
        256 << 10,
        33 << 10,
        512,
        1 << 20,
        100_000,
    ];
    let mut batch = Vec::new();
    let mut model = vec![0u8; SIZE as usize];
    let mut off = 0u64;
    let mut cookie = 0u64;
    for round in 0..3u64 {
        for (k, &n) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..n)
                .map(|i| (i as u64 * 31 + k as u64 * 7 + round) as u8)
                .collect();
            batch.extend_from_slice(&Client::request_bytes(CMD_WRITE, 0, cookie, off, n as u32));
            batch.extend_from_slice(&data);
            model[off as usize..off as usize + n].copy_from_slice(&data);
            cookie += 1;
            if k % 4 == 3 {
                batch.extend_from_slice(&Client::request_bytes(CMD_FLUSH, 0, cookie, 0, 0));
                cookie += 1;
            }
            off = (off + n as u64 + 123) % (SIZE - (1 << 20) - 1);
        }
    }
    let mut writer = c.s.try_clone().unwrap();
    let t = std::thread::spawn(move || {
        let cuts = [7usize, 4093, 70_001, 32, 31, 33, 131_072, 1, 200_000];
        let mut at = 0;
        for (i, n) in cuts.iter().cycle().enumerate() {
            if at >= batch.len() {
                break;
            }
            let end = (at + n).min(batch.len());
            writer.write_all(&batch[at..end]).unwrap();
            if i % 5 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            at = end;
        }
    });
    let mut seen = vec![false; cookie as usize];
    for _ in 0..cookie {
        let r = c.reply(None);
        assert_eq!(r.errno(), 0);
        assert!(!std::mem::replace(&mut seen[r.cookie() as usize], true));
    }
    t.join().unwrap();
    for at in (0..SIZE).step_by(1 << 20) {
        let got = c.read(at, 1 << 20).unwrap();
        assert!(
            got == model[at as usize..(at + (1 << 20)) as usize],
            "at {at}"
        );
    }
    c.disconnect();
}
