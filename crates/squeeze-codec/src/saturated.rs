//! An engine that says it is saturated: the engine inside compresses every
//! job as usual, but [`CompressEngine::backlog_bytes`] always answers "far
//! behind", so the write path's adaptive codec (`squeeze_engine::pipeline::
//! adapt`) steps down its ladder and stays at the fastest rung. Bytes are
//! then written below the target for the idle upgrade to rewrite: a drill
//! for tests and soaks (the engine's simulator, `squeeze serve
//! --simulate-saturated-engine` under the SIGKILL torture), never a
//! production setting.

use crate::engine::{CompressEngine, Job, JobResult};
use crate::Algorithm;

/// Reported backlog: far above any control law's threshold.
pub const SATURATED_BACKLOG_BYTES: u64 = 1 << 40;

/// `E` reporting itself always far behind.
pub struct Saturated<E>(pub E);

impl<E: CompressEngine> CompressEngine for Saturated<E> {
    fn name(&self) -> &str {
        "saturated"
    }
    fn threads(&self) -> usize {
        self.0.threads()
    }
    fn backlog_bytes(&self) -> u64 {
        SATURATED_BACKLOG_BYTES
    }
    fn submit(&self, alg: Algorithm, jobs: Vec<Job>, done: Box<dyn FnOnce(Vec<JobResult>) + Send>) {
        self.0.submit(alg, jobs, done)
    }
    fn compress_batch(&self, alg: Algorithm, jobs: Vec<Job>) -> Vec<JobResult> {
        self.0.compress_batch(alg, jobs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CpuPool, JobOutput};
    use squeeze_format::CodecId;

    #[test]
    fn compresses_like_the_engine_inside_but_reports_a_backlog() {
        let s = Saturated(CpuPool::new(1));
        assert_eq!(s.backlog_bytes(), SATURATED_BACKLOG_BYTES);
        assert_eq!(s.threads(), 1);
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 7) as u8).collect();
        let alg = Algorithm::new(CodecId::Lz4, 0);
        let job = Job::new(
            std::sync::Arc::new(data.clone()),
            0..data.len(),
            data.len(),
            false,
        );
        let r = s.compress_batch(alg, vec![job]);
        assert_eq!(r.len(), 1);
        match &r[0].output {
            JobOutput::Compressed(c) => {
                assert!(c.len() < data.len() / 4);
                let mut out = vec![0u8; data.len()];
                crate::decompress(alg.codec, c, &mut out).unwrap();
                assert_eq!(out, data);
            }
            other => panic!("{other:?}"),
        }
    }
}
