//! `Algorithm`: a codec from the registry plus its level, as an operator
//! writes it ("zstd:3", "lz4", "deflate:6", "none").
//!
//! Invariants:
//! - `parse(alg.to_string()) == alg` for every `alg` that `parse` returns
//!   (level 0 prints without a suffix and means "the codec's default").
//! - `parse` rejects levels outside [`Algorithm::level_range`] and any
//!   non-zero level on a codec without levels; `new` accepts anything and
//!   the compressor clamps (see [`Algorithm::effective_level`]).

use std::fmt;

use squeeze_format::CodecId;

use crate::CodecError;

/// zstd's default level in squeeze (libzstd's own default is 3; level 1
/// is the inline-compression sweet spot, to be re-measured by `bench`).
pub const ZSTD_LEVEL_DEFAULT: i32 = 1;
/// Accepted zstd levels: the fast negative levels down to -7, up to 22.
pub const ZSTD_LEVELS: (i32, i32) = (-7, 22);
/// libdeflate's default level.
pub const DEFLATE_LEVEL_DEFAULT: i32 = 6;
/// Accepted libdeflate levels.
pub const DEFLATE_LEVELS: (i32, i32) = (1, 12);

/// A codec and its level. `level == 0` means the codec's default; lz4,
/// snappy and none have no levels and ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Algorithm {
    pub codec: CodecId,
    pub level: i32,
}

impl Algorithm {
    /// Any codec and level; an out-of-range level is clamped when used.
    pub fn new(codec: CodecId, level: i32) -> Self {
        Algorithm { codec, level }
    }

    /// Parses "name" or "name:level" (names as in [`CodecId::name`],
    /// case-insensitive, surrounding whitespace ignored).
    pub fn parse(s: &str) -> Result<Algorithm, CodecError> {
        let s = s.trim();
        let (name, level) = match s.split_once(':') {
            Some((name, level)) => (name, Some(level)),
            None => (s, None),
        };
        let codec = CodecId::from_name(&name.to_ascii_lowercase())
            .ok_or_else(|| CodecError::UnknownAlgorithm(s.to_string()))?;
        let Some(level) = level else {
            return Ok(Algorithm::new(codec, 0));
        };
        let bad = |level: i32| {
            let (min, max) = Algorithm::level_range(codec).unwrap_or((0, 0));
            CodecError::BadLevel {
                codec,
                level,
                min,
                max,
            }
        };
        let level: i32 = level
            .trim()
            .parse()
            .map_err(|_| CodecError::UnknownAlgorithm(s.to_string()))?;
        match Algorithm::level_range(codec) {
            _ if level == 0 => Ok(Algorithm::new(codec, 0)),
            Some((min, max)) if (min..=max).contains(&level) => Ok(Algorithm::new(codec, level)),
            _ => Err(bad(level)),
        }
    }

    /// The accepted explicit levels of `codec`, or `None` if it has none.
    pub fn level_range(codec: CodecId) -> Option<(i32, i32)> {
        match codec {
            CodecId::Zstd => Some(ZSTD_LEVELS),
            CodecId::Deflate => Some(DEFLATE_LEVELS),
            CodecId::None | CodecId::Lz4 | CodecId::Snappy => None,
        }
    }

    /// The level the compressor really uses: the default for 0, clamped
    /// into [`Algorithm::level_range`], and 0 for codecs without levels.
    pub fn effective_level(&self) -> i32 {
        let default = match self.codec {
            CodecId::Zstd => ZSTD_LEVEL_DEFAULT,
            CodecId::Deflate => DEFLATE_LEVEL_DEFAULT,
            CodecId::None | CodecId::Lz4 | CodecId::Snappy => return 0,
        };
        let (min, max) = Algorithm::level_range(self.codec).expect("codec has levels");
        if self.level == 0 {
            default
        } else {
            self.level.clamp(min, max)
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.codec.name())?;
        if self.level != 0 && Algorithm::level_range(self.codec).is_some() {
            write!(f, ":{}", self.level)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = CodecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_display_round_trip() {
        for s in [
            "none",
            "lz4",
            "zstd",
            "zstd:1",
            "zstd:3",
            "zstd:-7",
            "zstd:22",
            "snappy",
            "deflate",
            "deflate:1",
            "deflate:12",
        ] {
            let alg = Algorithm::parse(s).unwrap();
            assert_eq!(alg.to_string(), s);
            assert_eq!(Algorithm::parse(&alg.to_string()).unwrap(), alg);
            assert_eq!(s.parse::<Algorithm>().unwrap(), alg);
        }
        assert_eq!(
            Algorithm::parse("zstd:3").unwrap(),
            Algorithm::new(CodecId::Zstd, 3)
        );
        assert_eq!(
            Algorithm::parse(" ZSTD:3 ").unwrap(),
            Algorithm::new(CodecId::Zstd, 3)
        );
        assert_eq!(
            Algorithm::parse("zstd:0").unwrap(),
            Algorithm::new(CodecId::Zstd, 0)
        );
        assert_eq!(
            Algorithm::parse("lz4").unwrap(),
            Algorithm::new(CodecId::Lz4, 0)
        );
    }

    #[test]
    fn parse_errors() {
        for s in ["", "lzo", "zstd:", "zstd:x", "zstd:1.5", "gzip:6", ":3"] {
            assert!(
                matches!(Algorithm::parse(s), Err(CodecError::UnknownAlgorithm(_))),
                "{s:?}"
            );
        }
        for (s, level) in [
            ("zstd:23", 23),
            ("zstd:-8", -8),
            ("deflate:13", 13),
            ("deflate:-1", -1),
            ("lz4:1", 1),
            ("snappy:3", 3),
            ("none:1", 1),
        ] {
            match Algorithm::parse(s) {
                Err(CodecError::BadLevel { level: l, .. }) => assert_eq!(l, level, "{s}"),
                other => panic!("{s}: {other:?}"),
            }
        }
        let msg = Algorithm::parse("zstd:99").unwrap_err().to_string();
        assert!(msg.contains("-7..=22"), "{msg}");
    }

    #[test]
    fn effective_levels() {
        assert_eq!(
            Algorithm::new(CodecId::Zstd, 0).effective_level(),
            ZSTD_LEVEL_DEFAULT
        );
        assert_eq!(Algorithm::new(CodecId::Zstd, 99).effective_level(), 22);
        assert_eq!(Algorithm::new(CodecId::Deflate, 0).effective_level(), 6);
        assert_eq!(Algorithm::new(CodecId::Deflate, -3).effective_level(), 1);
        assert_eq!(Algorithm::new(CodecId::Lz4, 5).effective_level(), 0);
        assert_eq!(Algorithm::new(CodecId::Lz4, 5).to_string(), "lz4");
    }
}
