//! The deduplication settings `create` and `set` take, and that a `set`
//! sends over the control socket (docs/DEDUP.md): `--dedup off|idle|inline` and
//! `--dedup-index MIB`; and the settings as `info`, `stats` and the
//! control socket show them.

use anyhow::{bail, Result};
use squeeze_engine::{DedupMode, DedupSettings};

/// Deduplication options.
#[derive(clap::Args, Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupArgs {
    /// Deduplication: off (the default: only `squeeze compact --dedup`),
    /// idle (the maintenance thread deduplicates while clients are idle)
    /// or inline (each write is looked up in an index of recent content
    /// and copies are linked as they are written; the idle pass runs too).
    #[arg(long = "dedup", value_name = "off|idle|inline", value_parser = parse_mode)]
    pub dedup: Option<String>,
    /// MiB of RAM for the fingerprint index, the idle pass's and, in mode
    /// inline, the write path's, each (default 256: about
    /// 13.8 million sectors, 52 GiB of data remembered at once; a larger
    /// volume keeps 1 fingerprint in up to 32 and finds copies from them;
    /// the inline index keeps 1 in 8, `squeeze serve --dedup-sample`: 416
    /// GiB of recent writes).
    #[arg(long, value_name = "MIB")]
    pub dedup_index: Option<u32>,
}

/// Checks a mode's name on the command line.
fn parse_mode(s: &str) -> std::result::Result<String, String> {
    DedupMode::parse(s).map(|m| m.name().to_string())
}

impl DedupArgs {
    /// Whether any option was given.
    pub fn given(&self) -> bool {
        self.dedup.is_some() || self.dedup_index.is_some()
    }

    /// `cur` with the options given applied; refuses a bad mode or budget
    /// (a request from the control socket is checked here too).
    pub fn apply(&self, cur: DedupSettings) -> Result<DedupSettings> {
        let mut s = cur;
        if let Some(m) = &self.dedup {
            s.mode = DedupMode::parse(m).map_err(anyhow::Error::msg)?;
        }
        if let Some(mib) = self.dedup_index {
            let max = squeeze_format::dedup_settings::MAX_INDEX_MIB;
            if mib == 0 || mib > max {
                bail!("--dedup-index must be from 1 to {max} (MiB), not {mib}");
            }
            s.index_mib = mib;
        }
        Ok(s)
    }
}

/// The settings as `info --json` and the control socket show them.
pub fn dedup_json(s: &DedupSettings) -> serde_json::Value {
    serde_json::json!({
        "mode": s.mode.name(),
        "index_bytes": s.index_bytes(),
    })
}

/// ... and as one line of text: "idle, index 256 MiB".
pub fn dedup_text(s: &DedupSettings) -> String {
    format!("{}, index {} MiB", s.mode.name(), s.index_bytes() >> 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_budgets_are_checked() {
        let cur = DedupSettings::default();
        let a = DedupArgs {
            dedup: Some("idle".into()),
            dedup_index: Some(64),
        };
        let s = a.apply(cur).unwrap();
        assert_eq!(s.mode, DedupMode::Idle);
        assert_eq!(s.index_mib, 64);
        let inline = DedupArgs {
            dedup: Some("inline".into()),
            dedup_index: None,
        };
        assert_eq!(inline.apply(cur).unwrap().mode, DedupMode::Inline);
        let unknown = DedupArgs {
            dedup: Some("sometimes".into()),
            dedup_index: None,
        };
        assert!(unknown
            .apply(cur)
            .unwrap_err()
            .to_string()
            .contains("unknown dedup mode"));
        let zero = DedupArgs {
            dedup: None,
            dedup_index: Some(0),
        };
        assert!(zero.apply(cur).is_err());
        assert_eq!(parse_mode("inline").unwrap(), "inline");
        assert!(parse_mode("sometimes").is_err());
        assert_eq!(parse_mode("off").unwrap(), "off");
    }
}
