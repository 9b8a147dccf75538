//! Client-supplied strings (export names, option data, queries) as they
//! may appear in log lines.
//!
//! A client controls these bytes: an export name may be 4 KiB of
//! anything (or, sent with NBD_OPT_EXPORT_NAME, 64 KiB), and a newline or
//! an escape sequence in it could forge or garble log lines. Invariant:
//! what `quote` returns is one line of at most `LOG_CHARS_MAX` escaped
//! characters between double quotes, followed by the full length in bytes
//! when it was cut.

use std::fmt::Write;

/// Characters of a client string kept in a log line.
pub const LOG_CHARS_MAX: usize = 96;

/// `bytes` quoted for a log line: invalid UTF-8 replaced, control and
/// other non-printable characters escaped (`\n`, `\u{1b}`), cut after
/// `LOG_CHARS_MAX` characters with `... (N bytes)` appended.
pub fn quote(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(LOG_CHARS_MAX + 24);
    out.push('"');
    let mut chars = text.chars();
    for c in chars.by_ref().take(LOG_CHARS_MAX) {
        out.extend(c.escape_debug());
    }
    out.push('"');
    if chars.next().is_some() {
        let _ = write!(out, "... ({} bytes)", bytes.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_are_quoted_whole() {
        assert_eq!(quote(b"disk0"), "\"disk0\"");
        assert_eq!(quote(b""), "\"\"");
    }

    #[test]
    fn control_characters_are_escaped() {
        let q = quote(b"a\nWARN forged\x1b[31m\0\xff");
        assert_eq!(q, "\"a\\nWARN forged\\u{1b}[31m\\0\u{fffd}\"");
        assert!(!q.chars().any(char::is_control));
    }

    #[test]
    fn long_strings_are_cut_with_their_length() {
        let name = vec![b'x'; 5000];
        let q = quote(&name);
        assert_eq!(
            q,
            format!("\"{}\"... (5000 bytes)", "x".repeat(LOG_CHARS_MAX))
        );
        // Exactly at the limit: nothing cut, no length.
        assert_eq!(quote(&name[..LOG_CHARS_MAX]).len(), LOG_CHARS_MAX + 2);
    }
}
