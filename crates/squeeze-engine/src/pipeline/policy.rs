//! Stage 2: BlueStore's compression policy, with its meaning
//! (DESIGN principle 5).
//!
//! Hints: `compression_mode` passive compresses only data hinted
//! compressible, aggressive compresses unless hinted incompressible, force
//! ignores hints. Applications that embed the engine pass a [`Hint`] with
//! each write. NBD clients send none; for such writes ([`Hint::None`]) the
//! sampling heuristic supplies the hint: a blob it judges hopeless is
//! "incompressible", any other is "compressible". So over NBD passive and
//! aggressive behave alike (both let the heuristic decide), and force skips
//! the heuristic.
//!
//! Required ratio: a compressed blob is kept only if the bytes it really
//! occupies (record header + payload, rounded to the 16-byte record
//! alignment) are at most `required_ratio` x its raw size; otherwise it is
//! stored raw and counted as rejected.

use super::adapt::{AdaptConfig, AdaptiveCodec};
use super::burst::RoomReading;
use squeeze_codec::{Algorithm, CompressEngine};
use squeeze_format::{CompressionMode, Policy, RECORD_ALIGN, RECORD_HEADER_SIZE};
use std::sync::Arc;

/// What the writer knows about its data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hint {
    #[default]
    None,
    Compressible,
    Incompressible,
}

/// The policy in force, with its algorithm resolved (the target), and the
/// adaptive codec that may write client data below it under load.
#[derive(Clone, Debug)]
pub struct ActivePolicy {
    pub policy: Policy,
    /// The target algorithm: what the policy asks for.
    pub algorithm: Algorithm,
    /// The ladder under the target and its control law (None: writes
    /// always get the target).
    pub adapt: Option<Arc<AdaptiveCodec>>,
}

impl ActivePolicy {
    /// The policy without adaptation: every blob gets the target.
    pub fn new(policy: Policy) -> ActivePolicy {
        ActivePolicy {
            policy,
            algorithm: Algorithm::new(policy.codec, policy.level),
            adapt: None,
        }
    }

    /// The policy with the adaptive codec under `adapt` when there is one
    /// (a target of none has a ladder of one rung).
    pub fn with_adaptation(policy: Policy, adapt: Option<AdaptConfig>) -> ActivePolicy {
        let mut p = ActivePolicy::new(policy);
        if let Some(config) = adapt {
            p.adapt = Some(Arc::new(AdaptiveCodec::new(p.algorithm, config)));
        }
        p
    }

    /// The algorithm for a client write batch about to go to `engine`: the
    /// target, or a faster rung of the ladder when the engine is behind or
    /// the cores busy (none, stored raw, while `room` allows:
    /// [`super::burst`]).
    pub fn write_algorithm(
        &self,
        engine: &dyn CompressEngine,
        written: u64,
        room: &dyn Fn() -> RoomReading,
    ) -> Algorithm {
        match &self.adapt {
            Some(a) => a.choose(engine, written, room),
            None => self.algorithm,
        }
    }

    /// The idle squeeze's algorithm: the policy's recompress algorithm when
    /// it is the target's codec at another level (zstd:9 over zstd:3).
    /// Client data is then written with the target and rewritten with this
    /// while clients are idle (`space::squeeze`); the busy cleaner does
    /// not use it. A recompress algorithm of another codec is the
    /// cleaner's instead (`space::relocate`).
    pub fn idle_algorithm(&self) -> Option<Algorithm> {
        let p = &self.policy;
        (p.recompress_codec != squeeze_format::CodecId::None
            && p.recompress_codec == p.codec
            && p.recompress_level != p.level)
            .then(|| Algorithm::new(p.recompress_codec, p.recompress_level))
    }

    pub fn max_blob_sectors(&self) -> u32 {
        self.policy.max_blob / squeeze_format::SECTOR_SIZE as u32
    }
}

/// What to do with one blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Store raw without trying the codec.
    Raw,
    /// Run the codec; when `heuristic` is set, let the incompressibility
    /// heuristic veto it first.
    Compress { heuristic: bool },
}

pub fn plan(p: &ActivePolicy, hint: Hint, raw_len: usize) -> Plan {
    use CompressionMode::*;
    if p.policy.codec == squeeze_format::CodecId::None || raw_len < p.policy.min_blob as usize {
        return Plan::Raw;
    }
    match (p.policy.mode, hint) {
        (None, _) => Plan::Raw,
        (Force, _) => Plan::Compress { heuristic: false },
        (_, Hint::Incompressible) => Plan::Raw,
        (_, Hint::Compressible) => Plan::Compress { heuristic: false },
        (Passive | Aggressive, Hint::None) => Plan::Compress { heuristic: true },
    }
}

/// Largest codec output that still meets the required ratio.
pub fn output_limit(p: &Policy, raw_len: usize) -> usize {
    let budget = (raw_len as u128 * u128::from(p.required_ratio_ppm) / 1_000_000) as u64;
    let budget = budget / RECORD_ALIGN * RECORD_ALIGN;
    budget.saturating_sub(RECORD_HEADER_SIZE as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use squeeze_format::CodecId;

    fn pol(mode: CompressionMode) -> ActivePolicy {
        ActivePolicy::new(Policy {
            codec: CodecId::Lz4,
            level: 0,
            mode,
            required_ratio_ppm: 875_000,
            min_blob: 8192,
            max_blob: 131072,
            recompress_codec: CodecId::None,
            recompress_level: 0,
            read_chunk: 0,
        })
    }

    #[test]
    fn modes_follow_bluestore() {
        use CompressionMode::*;
        assert_eq!(plan(&pol(None), Hint::Compressible, 65536), Plan::Raw);
        assert_eq!(
            plan(&pol(Force), Hint::Incompressible, 65536),
            Plan::Compress { heuristic: false }
        );
        assert_eq!(
            plan(&pol(Aggressive), Hint::Incompressible, 65536),
            Plan::Raw
        );
        assert_eq!(
            plan(&pol(Aggressive), Hint::None, 65536),
            Plan::Compress { heuristic: true }
        );
        assert_eq!(
            plan(&pol(Passive), Hint::Compressible, 65536),
            Plan::Compress { heuristic: false }
        );
        assert_eq!(
            plan(&pol(Passive), Hint::None, 65536),
            Plan::Compress { heuristic: true }
        );
        // below min_blob: never compressed
        assert_eq!(plan(&pol(Force), Hint::None, 4096), Plan::Raw);
    }

    #[test]
    fn limit_counts_header_and_alignment() {
        let p = pol(CompressionMode::Force).policy;
        let lim = output_limit(&p, 4096);
        // 0.875 * 4096 = 3584 -> at most 3584 bytes occupied, 64 of them header
        assert_eq!(lim, 3520);
        assert!(squeeze_format::record_bytes(lim as u64) <= 3584);
        assert!(squeeze_format::record_bytes(lim as u64 + 1) > 3584);
    }
}
