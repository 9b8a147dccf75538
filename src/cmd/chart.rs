//! `squeeze chart`: a bar chart from a JSON spec on stdin, as SVG on
//! stdout. It exists for bench/report.py and other scripts, so that the
//! project has one chart-maker (`svg.rs`, which `scan --chart` and
//! `tco --chart` use too) whatever language asks for the chart.
//!
//! The spec (`svg::BarChart`; unknown keys are refused):
//!
//! ```json
//! {
//!   "title": "CPU seconds per GiB (lower is better)",
//!   "y_label": "s/GiB",
//!   "groups": ["W1 128k write", "W3 nbdcopy tar"],
//!   "series": [{"name": "squeeze", "color": "#d62728"}, {"name": "qcow2"}],
//!   "cells": [
//!     [{"value": 1.2, "pale": 0.4, "label": "1.60", "tooltip": "squeeze, W1: 1.60"},
//!      {"text": "fails (EIO)"}],
//!     [{"value": 0.9}, {}]
//!   ],
//!   "reference": {"value": 1.0, "label": "1.0 = no saving"},
//!   "note": "solid: the server process; pale: the rest of the machine"
//! }
//! ```
//!
//! - `title`, `groups`, `series` (each a `name` and an optional CSS
//!   `color`, default the palette's) and `cells` are required; `y_label`,
//!   `reference` and `note` are optional.
//! - `cells[g][s]` is the bar of series `s` in group `g`: one row per
//!   group, one cell per series. A cell is `value` (a solid bar from zero),
//!   optionally with `pale` (an amount stacked on it, drawn pale), or
//!   `text` (a short text drawn upright where the bar would be: a failure),
//!   or `{}` (drawn as "n/a"). Amounts are finite and not negative.
//!   `label` (drawn over the bar; default the total, shortened: 1.23M) and
//!   `tooltip` (default "series, group: label") are the caller's
//!   formatting.
//! - `reference`: a dashed line across the plot at `value`; its `label`
//!   goes into the note line as "dashed line: LABEL".
//!
//! Exit status: 0 with the SVG on stdout; 2 when the spec is not JSON or
//! not a chart that can be drawn (one line on stderr naming the field);
//! 1 when stdin cannot be read.

use crate::svg::BarChart;
use anyhow::{Context, Result};
use std::io::Read;
use std::process::ExitCode;

/// Draw a bar chart from a JSON spec on stdin as SVG on stdout (for
/// bench/report.py and scripts).
///
/// It exists so that the project has one chart-maker. The spec: title,
/// groups, series [{name, color}], cells[group][series] ({value, pale,
/// label, tooltip}, {text} or {}), and optional y_label, reference {value,
/// label} and note; the module docs of src/cmd/chart.rs describe each key.
/// Exit status 2 when the spec is not JSON or cannot be drawn.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_a: Args) -> Result<ExitCode> {
    let mut spec = Vec::new();
    std::io::stdin()
        .read_to_end(&mut spec)
        .context("reading the spec from stdin")?;
    let svg = serde_json::from_slice::<BarChart>(&spec)
        .map_err(anyhow::Error::from)
        .and_then(|chart| chart.draw());
    match svg {
        Ok(svg) => {
            crate::util::write_stdout(format_args!("{svg}"));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("squeeze chart: bad spec: {e}");
            Ok(ExitCode::from(2))
        }
    }
}
