//! `squeeze chart`: a JSON spec on stdin gives one well-formed SVG document
//! on stdout with the bars, the failure texts, the pale stacks and the
//! reference line it asks for; a spec that is not JSON, or not a chart,
//! is refused with one line naming the problem and exit status 2.

use std::io::Write;
use std::process::{Command, Stdio};

/// (exit code, stdout, stderr) of `squeeze chart` fed `spec`.
fn chart(spec: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .arg("chart")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run squeeze chart");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().expect("exited"),
        String::from_utf8(out.stdout).expect("UTF-8 output"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The element names of a well-formed XML document, in document order;
/// panics at the first thing that is not well-formed (unbalanced or
/// crossed tags, an unquoted attribute, a raw `<` or `&` in text).
fn elements(xml: &str) -> Vec<String> {
    fn text_ok(t: &str) {
        assert!(!t.contains('<'), "raw < in {t:?}");
        for (i, _) in t.match_indices('&') {
            let rest = &t[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| rest.starts_with(e)),
                "raw & in {t:?}"
            );
        }
    }
    let mut open: Vec<String> = Vec::new();
    let mut names = Vec::new();
    let mut rest = xml.trim();
    assert!(rest.starts_with('<'), "no root element");
    while let Some(lt) = rest.find('<') {
        text_ok(&rest[..lt]);
        let gt = rest[lt..].find('>').expect("unclosed tag") + lt;
        let tag = &rest[lt + 1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop().as_deref(), Some(name.trim()), "crossed tags");
            if open.is_empty() {
                break;
            }
            continue;
        }
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let name = tag.split_whitespace().next().expect("a tag name");
        // attributes: name="value" pairs, values escaped
        let mut attrs = tag[name.len()..].trim();
        while !attrs.is_empty() {
            let eq = attrs
                .find("=\"")
                .unwrap_or_else(|| panic!("attribute in <{tag}>"));
            let end = attrs[eq + 2..].find('"').expect("closing quote") + eq + 2;
            text_ok(&attrs[eq + 2..end]);
            attrs = attrs[end + 1..].trim_start();
        }
        names.push(name.to_string());
        if !self_closing {
            open.push(name.to_string());
        }
    }
    assert!(open.is_empty(), "unclosed elements {open:?}");
    assert!(rest.trim().is_empty(), "content after the root element");
    names
}

const SPEC: &str = r##"{
  "title": "Throughput, MB/s <higher & better>",
  "y_label": "MB/s",
  "groups": ["W1 write", "W3 copy"],
  "series": [{"name": "squeeze", "color": "#d62728"}, {"name": "qcow2"}, {"name": "zram"}],
  "cells": [
    [{"value": 640, "label": "640", "tooltip": "squeeze, W1 write: 640 MB/s"},
     {"text": "fails (EIO)"},
     {"value": 1.5, "pale": 2.5}],
    [{"value": 320}, {}, {"value": 900, "label": "900"}]
  ],
  "reference": {"value": 500, "label": "the target"},
  "note": "one run"
}"##;

#[test]
fn a_spec_becomes_one_well_formed_svg() {
    let (code, svg, err) = chart(SPEC);
    assert_eq!(code, 0, "{err}");
    let names = elements(&svg);
    assert_eq!(names[0], "svg");
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.contains("<title>Throughput, MB/s &lt;higher &amp; better&gt;</title>"));
    // bars: 640, 1.5 (+ its pale 2.5), 320, 900; the failure and the empty
    // cell are texts
    let bars: Vec<&str> = svg
        .lines()
        .filter(|l| l.starts_with("<rect") && l.contains("<title>"))
        .collect();
    assert_eq!(bars.len(), 5, "{svg}");
    assert!(
        bars[0].contains("fill=\"#d62728\"") && bars[0].contains(">squeeze, W1 write: 640 MB/s<")
    );
    assert_eq!(
        bars.iter().filter(|b| b.contains("fill-opacity")).count(),
        1
    );
    assert!(svg.contains(">fails (EIO)</text>") && svg.contains(">n/a</text>"));
    assert!(
        svg.contains(">4.00</text>"),
        "the stacked bar's label is its total"
    );
    // the reference line, and its label in the note
    assert_eq!(svg.matches("stroke-dasharray").count(), 1);
    assert!(svg.contains(">one run; dashed line: the target</text>"));
    // legend, group names and y label
    for t in ["squeeze", "qcow2", "zram", "W1 write", "W3 copy", "MB/s"] {
        assert!(svg.contains(&format!(">{t}</text>")), "{t}");
    }
}

#[test]
fn bad_specs_are_refused_with_status_2() {
    for (spec, says) in [
        ("", "EOF"),
        ("{not json", "key must be a string"),
        (
            r#"{"title": "t", "groups": [], "series": []}"#,
            "missing field `cells`",
        ),
        (
            r#"{"title": "t", "groups": ["g"], "series": [{"name": "s"}], "cells": [[{"vlaue": 1}]]}"#,
            "unknown field `vlaue`",
        ),
        (
            r#"{"title": "t", "groups": ["g", "h"], "series": [{"name": "s"}], "cells": [[{"value": 1}]]}"#,
            "cells has 1 rows for 2 groups",
        ),
        (
            r#"{"title": "t", "groups": ["g"], "series": [{"name": "s"}], "cells": [[{"value": -1}]]}"#,
            "cells[0][0]",
        ),
    ] {
        let (code, out, err) = chart(spec);
        assert_eq!(code, 2, "{spec}: {err}");
        assert!(out.is_empty(), "{spec}: {out}");
        assert!(err.starts_with("squeeze chart: bad spec: "), "{err}");
        assert!(err.contains(says), "{spec}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
