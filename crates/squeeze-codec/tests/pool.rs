//! The CPU pool completes batches in job order, once, from many
//! submitters at a time, and its output decodes back to the input.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use squeeze_codec::testdata::{fio_like, random, text};
use squeeze_codec::{decompress, Algorithm, CompressEngine, CpuPool, Job, JobOutput, JobResult};

fn batch(seed: u64) -> (Arc<Vec<u8>>, Vec<Job>) {
    // 64 blobs of 4 KiB in one buffer: fio-like, text and random mixed.
    let mut buf = Vec::new();
    for i in 0..64u64 {
        let blob = match i % 4 {
            0 | 1 => fio_like(4096, 60, 512, seed + i),
            2 => text(4096, seed + i),
            _ => random(4096, seed + i),
        };
        buf.extend_from_slice(&blob);
    }
    let input = Arc::new(buf);
    let jobs = (0..64)
        .map(|i| Job::new(Arc::clone(&input), i * 4096..(i + 1) * 4096, 3584, false))
        .collect();
    (input, jobs)
}

fn check(alg: Algorithm, input: &[u8], results: &[JobResult]) {
    assert_eq!(results.len(), 64);
    for (i, r) in results.iter().enumerate() {
        let blob = &input[i * 4096..(i + 1) * 4096];
        match &r.output {
            JobOutput::Compressed(c) => {
                assert!(c.len() <= 3584);
                let mut back = vec![0u8; 4096];
                decompress(alg.codec, c, &mut back).unwrap();
                assert!(back == blob, "job {i} decodes to other bytes");
                assert_ne!(i % 4, 3, "random blob {i} compressed under the limit");
            }
            JobOutput::TooBig => assert_eq!(i % 4, 3, "job {i} too big"),
            JobOutput::Skipped => panic!("job {i} skipped without asking"),
        }
    }
}

#[test]
fn checksum_of_the_output_only_when_asked() {
    let pool = CpuPool::new(2);
    let alg = Algorithm::parse("zstd:3").unwrap();
    let (input, jobs) = batch(7);
    // Both paths of compress_batch: the first job runs on the caller, the
    // rest on the workers.
    let asked: Vec<Job> = jobs.iter().cloned().map(Job::with_checksum).collect();
    let results = pool.compress_batch(alg, asked);
    check(alg, &input, &results);
    for (i, r) in results.iter().enumerate() {
        match &r.output {
            JobOutput::Compressed(c) => assert_eq!(
                r.output_crc32c,
                Some(squeeze_format::checksum::crc32c(c)),
                "job {i}"
            ),
            _ => assert_eq!(r.output_crc32c, None, "job {i}: a checksum without output"),
        }
    }
    let results = pool.compress_batch(alg, jobs);
    assert!(results.iter().all(|r| r.output_crc32c.is_none()));
}

#[test]
fn batch_of_64_in_order_and_decodes() {
    let pool = CpuPool::new(2);
    assert_eq!(pool.threads(), 2);
    assert_eq!(pool.name(), "cpu-pool");
    for alg in ["lz4", "zstd:3", "snappy", "deflate"] {
        let alg = Algorithm::parse(alg).unwrap();
        let (input, jobs) = batch(1);
        let results = pool.compress_batch(alg, jobs);
        check(alg, &input, &results);
        assert!(results.iter().any(|r| r.cpu_ns > 0), "no CPU time measured");
    }
    assert_eq!(pool.failed_jobs(), 0);
}

#[test]
fn heuristic_skips_random_blobs() {
    let pool = CpuPool::new(2);
    let (input, mut jobs) = batch(2);
    for j in &mut jobs {
        j.skip_if_incompressible = true;
    }
    let results = pool.compress_batch(Algorithm::parse("lz4").unwrap(), jobs);
    for (i, r) in results.iter().enumerate() {
        if i % 4 == 3 {
            assert_eq!(r.output, JobOutput::Skipped, "random job {i}");
        } else {
            assert!(matches!(r.output, JobOutput::Compressed(_)), "job {i}");
        }
    }
    drop(input);
}

#[test]
fn submit_from_several_threads_at_once() {
    let pool = Arc::new(CpuPool::new(2));
    let calls = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let pool = Arc::clone(&pool);
            let calls = Arc::clone(&calls);
            s.spawn(move || {
                let alg =
                    Algorithm::parse(["lz4", "zstd", "snappy", "deflate:1"][t as usize]).unwrap();
                let mut waits = Vec::new();
                for round in 0..5 {
                    let (input, jobs) = batch(100 * t + round);
                    let (tx, rx) = crossbeam_channel::bounded(1);
                    let calls = Arc::clone(&calls);
                    pool.submit(
                        alg,
                        jobs,
                        Box::new(move |results| {
                            calls.fetch_add(1, Ordering::SeqCst);
                            tx.send(results).unwrap();
                        }),
                    );
                    waits.push((input, rx));
                }
                for (input, rx) in waits {
                    check(alg, &input, &rx.recv().unwrap());
                    assert!(rx.try_recv().is_err(), "done called twice");
                }
            });
        }
    });
    assert_eq!(calls.load(Ordering::SeqCst), 20);
}

#[test]
fn empty_batch_and_drop_with_work_queued() {
    let pool = CpuPool::new(1);
    assert!(pool
        .compress_batch(Algorithm::parse("zstd").unwrap(), Vec::new())
        .is_empty());
    // Dropping the pool still completes every queued batch.
    let calls = Arc::new(AtomicUsize::new(0));
    for seed in 0..3 {
        let (_, jobs) = batch(seed);
        let calls = Arc::clone(&calls);
        pool.submit(
            Algorithm::parse("deflate:9").unwrap(),
            jobs,
            Box::new(move |r| {
                assert_eq!(r.len(), 64);
                calls.fetch_add(1, Ordering::SeqCst);
            }),
        );
    }
    drop(pool);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn default_pool_uses_every_cpu() {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(CpuPool::new(0).threads(), n);
}

#[test]
fn compress_batch_from_several_threads_with_submitters() {
    let pool = Arc::new(CpuPool::new(2));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let pool = Arc::clone(&pool);
            s.spawn(move || {
                let alg =
                    Algorithm::parse(["lz4", "zstd", "snappy", "deflate:1"][t as usize]).unwrap();
                for round in 0..5 {
                    let (input, jobs) = batch(1000 * t + round);
                    if t % 2 == 0 {
                        check(alg, &input, &pool.compress_batch(alg, jobs));
                    } else {
                        let (tx, rx) = crossbeam_channel::bounded(1);
                        pool.submit(alg, jobs, Box::new(move |r| tx.send(r).unwrap()));
                        check(alg, &input, &rx.recv().unwrap());
                    }
                }
            });
        }
    });
    assert_eq!(pool.failed_jobs(), 0);
}
