//! The one SVG chart-maker: `scatter` (`scan --chart`: ratio against
//! speed) and `BarChart` (`tco --chart`, and `squeeze chart`, which draws
//! bench/report.py's charts from a JSON spec). Hand-written SVG: no
//! plotting dependency, readable output, a fixed default palette.
//!
//! Invariants: every text and colour taken from the caller is escaped, so
//! the output is one well-formed SVG document, with a `<title>`, whatever
//! the input; a `BarChart` is drawn only once `BarChart::check` accepted it
//! (one row of cells per group and one cell per series in each row, amounts
//! finite and not negative: bars start at zero).

use anyhow::{bail, ensure, Result};
use serde::Deserialize;
use std::fmt::Write;

/// The width of every chart, in px.
const W: f64 = 760.0;
const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// Text for an element's content or a quoted attribute value.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The opening tag, the document's `<title>`, a white background and the
/// title drawn centred over `[title_left, title_right]`.
fn header(title: &str, height: f64, title_left: f64, title_right: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, "<title>{}</title>", esc(title));
    let _ = writeln!(s, r#"<rect width="{W}" height="{height}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        (title_left + title_right) / 2.0,
        esc(title)
    );
    s
}

/// A text rotated to run upwards from (x, y).
fn upright(x: f64, y: f64, attrs: &str, text: &str) -> String {
    format!(
        r#"<text x="{x:.1}" y="{y:.1}" transform="rotate(-90 {x:.1} {y:.1})" {attrs}>{}</text>"#,
        esc(text)
    )
}

// ---------------------------------------------------------------------------
// Scatter: ratio against speed
// ---------------------------------------------------------------------------

const SCATTER_H: f64 = 460.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

/// A "nice" upper bound for an axis.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

/// A named line of points (x, y, label).
pub type Series = (String, Vec<(f64, f64, String)>);
/// One line of points per series, x on a log scale.
pub fn scatter(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let pts = series.iter().flat_map(|s| s.1.iter());
    let xs: Vec<f64> = pts.clone().map(|p| p.0).filter(|x| *x > 0.0).collect();
    let (xmin, xmax) = if xs.is_empty() {
        (1.0, 10.0)
    } else {
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(0.0, f64::max);
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
        )
    };
    let ymax = nice_max(pts.map(|p| p.1).fold(1.0, f64::max));
    let (pw, ph) = (W - LEFT - RIGHT, SCATTER_H - TOP - BOTTOM);
    let fx =
        |x: f64| LEFT + (x.max(xmin).log10() - xmin.log10()) / (xmax.log10() - xmin.log10()) * pw;
    let fy = |y: f64| TOP + ph - y / ymax * ph;
    let mut s = header(title, SCATTER_H, LEFT, W - RIGHT);
    // Axes and grid.
    let mut d = xmin;
    while d <= xmax * 1.0001 {
        let x = fx(d);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            d
        );
        d *= 10.0;
    }
    for i in 0..=5 {
        let v = ymax * f64::from(i) / 5.0;
        let y = fy(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v:.2}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        SCATTER_H - 18.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    for (i, (name, points)) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let path: Vec<String> = points
            .iter()
            .map(|p| format!("{:.1},{:.1}", fx(p.0), fy(p.1)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="1.5"/>"#,
            path.join(" ")
        );
        for (x, y, label) in points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{c}"><title>{} {}: ratio {y:.3}, {x:.0} MB/s</title></circle>"#,
                fx(*x),
                fy(*y),
                esc(name),
                esc(label)
            );
        }
        if let Some((x, y, label)) = points.first() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="10" fill="{c}">{}</text>"#,
                fx(*x) + 5.0,
                fy(*y) - 5.0,
                esc(label)
            );
        }
        let ly = TOP + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="{c}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            W - RIGHT + 15.0,
            ly - 10.0,
            W - RIGHT + 32.0,
            ly,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

// ---------------------------------------------------------------------------
// Grouped bars
// ---------------------------------------------------------------------------

/// Margins, legend and plot sizes of a bar chart, in px.
const BAR_LEFT: f64 = 64.0;
const BAR_RIGHT: f64 = 16.0;
const LEGEND_TOP: f64 = 46.0;
const LEGEND_ROW: f64 = 18.0;
const PLOT_H: f64 = 260.0;
const BAR_BOTTOM: f64 = 44.0;
const BAR_W_MAX: f64 = 30.0;
/// Estimated width of a character of 12 px text (legend wrapping).
const CHAR_W_LEGEND: f64 = 6.6;
/// Estimated width of a character of a value label: a wider label is
/// turned upright along its bar.
const CHAR_W_LABEL: f64 = 5.5;
/// A cell with neither amounts nor text.
const NO_VALUE: &str = "n/a";

/// A grouped bar chart: one group per category along the x axis, one bar
/// per series in each group, a legend above the plot (wrapped to the
/// width), an optional note line under it and an optional dashed
/// reference line. `squeeze chart` reads it as JSON (its module docs are
/// the spec).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BarChart {
    pub title: String,
    /// Drawn upright left of the axis.
    pub y_label: Option<String>,
    pub groups: Vec<String>,
    pub series: Vec<BarSeries>,
    /// `cells[g][s]`: the bar of series `s` in group `g`.
    pub cells: Vec<Vec<Cell>>,
    pub reference: Option<Reference>,
    /// A line of small text under the legend.
    pub note: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BarSeries {
    pub name: String,
    /// A CSS colour (`#d62728`, `steelblue`); default: the palette's
    /// colour for the series' position.
    pub color: Option<String>,
}

/// One bar: a solid `value` with an optional `pale` amount stacked on it,
/// or a short `text` drawn upright where the bar would be (a failure:
/// "fails (EIO)"). A cell with none of them reads "n/a".
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cell {
    pub value: Option<f64>,
    pub pale: Option<f64>,
    /// Drawn over the bar; default: the total (value + pale), shortened.
    pub label: Option<String>,
    /// The bar's tooltip; default: "series, group: label".
    pub tooltip: Option<String>,
    pub text: Option<String>,
}

impl Cell {
    pub fn value(v: f64) -> Cell {
        Cell {
            value: Some(v),
            ..Cell::default()
        }
    }

    /// value + pale; None for a text (or empty) cell.
    fn total(&self) -> Option<f64> {
        if self.text.is_some() || (self.value.is_none() && self.pale.is_none()) {
            return None;
        }
        Some(self.value.unwrap_or(0.0) + self.pale.unwrap_or(0.0))
    }
}

/// A dashed horizontal line across the plot at `value`; its label goes
/// into the note line ("dashed line: ...").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    pub value: f64,
    pub label: Option<String>,
}

fn amount_ok(v: Option<f64>) -> bool {
    v.is_none_or(|v| v.is_finite() && v >= 0.0)
}

fn color_ok(c: &str) -> bool {
    !c.is_empty()
        && c.len() <= 64
        && c.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "#(),.% ".contains(ch))
}

impl BarChart {
    /// Whether the chart can be drawn; the error names the first field
    /// that cannot.
    pub fn check(&self) -> Result<()> {
        ensure!(
            self.cells.len() == self.groups.len(),
            "cells has {} rows for {} groups (one row per group)",
            self.cells.len(),
            self.groups.len()
        );
        for (g, row) in self.cells.iter().enumerate() {
            ensure!(
                row.len() == self.series.len(),
                "cells[{g}] has {} cells for {} series (one per series)",
                row.len(),
                self.series.len()
            );
            for (s, c) in row.iter().enumerate() {
                if !(amount_ok(c.value) && amount_ok(c.pale)) {
                    bail!("cells[{g}][{s}]: value and pale must be finite and not negative (bars start at zero)");
                }
                if c.text.is_some() && (c.value.is_some() || c.pale.is_some()) {
                    bail!("cells[{g}][{s}]: a cell is either a text or amounts, not both");
                }
            }
        }
        for (s, series) in self.series.iter().enumerate() {
            if let Some(c) = &series.color {
                ensure!(
                    color_ok(c),
                    "series[{s}].color {c:?} is not a CSS colour (like #d62728 or steelblue)"
                );
            }
        }
        if let Some(r) = &self.reference {
            ensure!(
                r.value.is_finite() && r.value >= 0.0,
                "reference.value must be finite and not negative"
            );
        }
        Ok(())
    }

    fn color(&self, s: usize) -> &str {
        self.series[s]
            .color
            .as_deref()
            .unwrap_or(PALETTE[s % PALETTE.len()])
    }

    /// The SVG document, or why the chart cannot be drawn (`check`).
    pub fn draw(&self) -> Result<String> {
        self.check()?;
        let (left, right) = (BAR_LEFT, W - BAR_RIGHT);
        // The legend, wrapped: (x, baseline y, series).
        let mut legend = Vec::with_capacity(self.series.len());
        let (mut x, mut y, mut rows) = (left, LEGEND_TOP, 1u32);
        for s in 0..self.series.len() {
            let w = 17.0 + CHAR_W_LEGEND * self.series[s].name.chars().count() as f64 + 16.0;
            if x + w > right && x > left {
                (x, y, rows) = (left, y + LEGEND_ROW, rows + 1);
            }
            legend.push((x, y, s));
            x += w;
        }
        let mut note = self.note.clone().unwrap_or_default();
        if let Some(label) = self.reference.as_ref().and_then(|r| r.label.as_deref()) {
            if !note.is_empty() {
                note.push_str("; ");
            }
            let _ = write!(note, "dashed line: {label}");
        }
        let legend_bottom = LEGEND_TOP + LEGEND_ROW * f64::from(rows);
        let top = legend_bottom + if note.is_empty() { 0.0 } else { 16.0 } + 14.0;
        let height = top + PLOT_H + BAR_BOTTOM;
        let base = top + PLOT_H;

        let vmax = self
            .cells
            .iter()
            .flatten()
            .filter_map(Cell::total)
            .chain(self.reference.as_ref().map(|r| r.value))
            .fold(0.0, f64::max);
        let step = nice_step(if vmax > 0.0 { vmax } else { 1.0 });
        let ymax = step * ((if vmax > 0.0 { vmax * 1.08 } else { 1.0 }) / step).ceil();
        let fy = |v: f64| base - PLOT_H * v / ymax;

        let mut o = header(&self.title, height, 0.0, W);
        for &(x, y, s) in &legend {
            let _ = writeln!(
                o,
                r#"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{y:.1}">{}</text>"#,
                y - 10.0,
                esc(self.color(s)),
                x + 17.0,
                esc(&self.series[s].name)
            );
        }
        if !note.is_empty() {
            let _ = writeln!(
                o,
                r##"<text x="{left}" y="{:.1}" font-size="11" fill="#555">{}</text>"##,
                legend_bottom + 4.0,
                esc(&note)
            );
        }
        // Grid and axis.
        let mut i = 0u32;
        loop {
            let t = step * f64::from(i);
            if t > ymax + step * 1e-9 {
                break;
            }
            let y = fy(t);
            let _ = writeln!(
                o,
                r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11" fill="#444">{}</text>"##,
                left - 6.0,
                y + 4.0,
                tick_label(t)
            );
            i += 1;
        }
        let _ = writeln!(
            o,
            r##"<line x1="{left}" y1="{base:.1}" x2="{right}" y2="{base:.1}" stroke="#333"/>"##
        );
        if let Some(label) = &self.y_label {
            let _ = writeln!(
                o,
                "{}",
                upright(14.0, top + PLOT_H / 2.0, r#"text-anchor="middle""#, label)
            );
        }
        // The bars, group by group.
        let gw = (right - left) / self.groups.len().max(1) as f64;
        let bw = BAR_W_MAX.min(gw * 0.8 / self.series.len().max(1) as f64);
        let fs = if bw >= 24.0 { 10 } else { 9 };
        for (g, group) in self.groups.iter().enumerate() {
            let gx = left + g as f64 * gw + (gw - bw * self.series.len() as f64) / 2.0;
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                left + g as f64 * gw + gw / 2.0,
                base + 18.0,
                esc(group)
            );
            for (s, cell) in self.cells[g].iter().enumerate() {
                let x = gx + s as f64 * bw;
                let cx = x + bw / 2.0;
                let Some(total) = cell.total() else {
                    let text = cell.text.as_deref().unwrap_or(NO_VALUE);
                    let attrs =
                        format!(r##"font-size="{fs}" fill="#999" dominant-baseline="middle""##);
                    let _ = writeln!(o, "{}", upright(cx, base - 4.0, &attrs, text));
                    continue;
                };
                let v = cell.value.unwrap_or(0.0);
                let label = cell.label.clone().unwrap_or_else(|| short(total));
                let tip = cell
                    .tooltip
                    .clone()
                    .unwrap_or_else(|| format!("{}, {group}: {label}", self.series[s].name));
                let color = esc(self.color(s));
                let (tip, bar_w) = (esc(&tip), bw - 2.0);
                if v > 0.0 {
                    let _ = writeln!(
                        o,
                        r#"<rect x="{:.1}" y="{:.1}" width="{bar_w:.1}" height="{:.1}" fill="{color}"><title>{tip}</title></rect>"#,
                        x + 1.0,
                        fy(v),
                        base - fy(v)
                    );
                }
                if cell.pale.is_some_and(|p| p > 0.0) {
                    let _ = writeln!(
                        o,
                        r#"<rect x="{:.1}" y="{:.1}" width="{bar_w:.1}" height="{:.1}" fill="{color}" fill-opacity="0.35"><title>{tip}</title></rect>"#,
                        x + 1.0,
                        fy(total),
                        fy(v) - fy(total)
                    );
                }
                let ly = fy(total) - 3.0;
                if CHAR_W_LABEL * label.chars().count() as f64 > bw {
                    let attrs = format!(r#"font-size="{fs}" dominant-baseline="middle""#);
                    let _ = writeln!(o, "{}", upright(cx, ly, &attrs, &label));
                } else {
                    let _ = writeln!(
                        o,
                        r#"<text x="{cx:.1}" y="{ly:.1}" text-anchor="middle" font-size="{fs}">{}</text>"#,
                        esc(&label)
                    );
                }
            }
        }
        if let Some(r) = &self.reference {
            let y = fy(r.value);
            let _ = writeln!(
                o,
                r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#333" stroke-dasharray="5,4"/>"##
            );
        }
        o.push_str("</svg>\n");
        Ok(o)
    }
}

/// A round step for about `ticks` (6) grid lines up to `vmax`.
fn nice_step(vmax: f64) -> f64 {
    let raw = vmax / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if raw <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

/// An axis tick: 0.25, 1.5, 800, 12k, 3.5M.
fn tick_label(t: f64) -> String {
    if t < 1e4 {
        general(t)
    } else if t < 1e7 {
        format!("{}k", general(t / 1e3))
    } else {
        format!("{}M", general(t / 1e6))
    }
}

/// Six significant digits, trailing zeros dropped (C's `%g` for numbers
/// from 1e-4 up): 0.30000000000000004 -> "0.3".
fn general(v: f64) -> String {
    if v == 0.0 {
        return "0".to_string();
    }
    let exp = v.abs().log10().floor() as i32;
    let decimals = (5 - exp).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}
/// 1234567 -> "1.23M".
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(names: &[&str]) -> Vec<BarSeries> {
        names
            .iter()
            .map(|n| BarSeries {
                name: n.to_string(),
                color: None,
            })
            .collect()
    }

    /// Two groups of two series, every cell a plain value.
    fn two_by_two() -> BarChart {
        BarChart {
            title: "t".into(),
            groups: vec!["g0".into(), "g1".into()],
            series: series(&["a", "b"]),
            cells: vec![
                vec![Cell::value(1.0), Cell::value(2.0)],
                vec![Cell::value(3.0), Cell::value(4.0)],
            ],
            ..BarChart::default()
        }
    }

    /// The bars: rects that carry a tooltip.
    fn bars(svg: &str) -> Vec<&str> {
        svg.lines()
            .filter(|l| l.starts_with("<rect") && l.contains("<title>"))
            .collect()
    }

    fn attr(line: &str, name: &str) -> f64 {
        let key = format!(" {name}=\"");
        let at = line
            .find(&key)
            .unwrap_or_else(|| panic!("{name} in {line}"))
            + key.len();
        line[at..].split('"').next().unwrap().parse().unwrap()
    }

    #[test]
    fn one_bar_per_cell_with_default_labels_and_tooltips() {
        let svg = two_by_two().draw().unwrap();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.ends_with("</svg>\n"));
        assert!(svg.contains("<title>t</title>"));
        let b = bars(&svg);
        assert_eq!(b.len(), 4);
        assert!(b[3].contains("<title>b, g1: 4.00</title>"), "{}", b[3]);
        assert!(b[0].contains(&format!("fill=\"{}\"", PALETTE[0])));
        assert!(b[1].contains(&format!("fill=\"{}\"", PALETTE[1])));
        assert!(svg.contains(">4.00</text>"));
        // a higher value, a taller bar on the same base line
        assert!(attr(b[3], "height") > attr(b[0], "height"));
        let base = |l: &str| attr(l, "y") + attr(l, "height");
        assert!((base(b[0]) - base(b[3])).abs() < 0.11);
    }

    #[test]
    fn a_failure_is_a_text_instead_of_a_bar() {
        let mut c = two_by_two();
        c.cells[1][0] = Cell {
            text: Some("fails (EIO)".into()),
            ..Cell::default()
        };
        c.cells[0][1] = Cell::default();
        let svg = c.draw().unwrap();
        assert_eq!(bars(&svg).len(), 2);
        let fail = svg
            .lines()
            .find(|l| l.contains(">fails (EIO)</text>"))
            .unwrap();
        assert!(
            fail.contains("rotate(-90") && fail.contains("fill=\"#999\""),
            "{fail}"
        );
        assert!(svg.contains(">n/a</text>"), "an empty cell reads n/a");
    }

    #[test]
    fn a_pale_amount_is_stacked_on_the_bar() {
        let mut c = two_by_two();
        c.cells[0][0] = Cell {
            value: Some(1.0),
            pale: Some(0.5),
            tooltip: Some("a, g0: 1.50 (1.00 server)".into()),
            ..Cell::default()
        };
        let svg = c.draw().unwrap();
        let b = bars(&svg);
        assert_eq!(b.len(), 5);
        let (solid, pale) = (b[0], b[1]);
        assert!(!solid.contains("fill-opacity") && pale.contains("fill-opacity=\"0.35\""));
        assert!(pale.contains("<title>a, g0: 1.50 (1.00 server)</title>"));
        // the pale rect sits on the solid one and is half its height
        assert!((attr(pale, "y") + attr(pale, "height") - attr(solid, "y")).abs() < 0.11);
        assert!((2.0 * attr(pale, "height") - attr(solid, "height")).abs() < 0.21);
        assert!(svg.contains(">1.50</text>"), "the label is the total");
        // only a pale amount: no solid bar
        c.cells[0][0] = Cell {
            pale: Some(2.0),
            ..Cell::default()
        };
        assert_eq!(bars(&c.draw().unwrap()).len(), 4);
    }

    #[test]
    fn the_reference_line_is_dashed_and_named_in_the_note() {
        let mut c = two_by_two();
        c.reference = Some(Reference {
            value: 10.0,
            label: Some("10 = target".into()),
        });
        c.note = Some("solid: server".into());
        let svg = c.draw().unwrap();
        let line = svg
            .lines()
            .find(|l| l.contains("stroke-dasharray"))
            .unwrap();
        assert!(svg.contains(">solid: server; dashed line: 10 = target</text>"));
        // above every bar: the axis reaches the reference
        let top = bars(&svg)
            .iter()
            .map(|b| attr(b, "y"))
            .fold(f64::MAX, f64::min);
        assert!(attr(line, "y1") < top, "{line}");
        assert!(svg.contains(">10</text>"), "a tick at the reference");
    }

    #[test]
    fn wide_labels_turn_upright_and_the_legend_wraps() {
        let mut c = two_by_two();
        c.cells[0][0].label = Some("123456 IOPS".into());
        c.series = series(&["a rather long series name"; 2]);
        let short_legend = c.draw().unwrap();
        c.series = series(&["a rather long series name"; 6]);
        for row in &mut c.cells {
            row.resize(6, Cell::value(1.0));
        }
        let svg = c.draw().unwrap();
        let label = svg
            .lines()
            .find(|l| l.contains(">123456 IOPS</text>"))
            .unwrap();
        assert!(label.contains("rotate(-90"), "{label}");
        let height = |s: &str| attr(s.lines().next().unwrap(), "height");
        assert!(height(&svg) >= height(&short_legend) + LEGEND_ROW);
    }

    #[test]
    fn text_is_escaped() {
        let mut c = two_by_two();
        c.title = "a <b> & \"c\"".into();
        c.groups[0] = "<g>".into();
        let svg = c.draw().unwrap();
        assert!(svg.contains("<title>a &lt;b&gt; &amp; &quot;c&quot;</title>"));
        assert!(svg.contains(">&lt;g&gt;</text>"));
    }

    #[test]
    fn charts_that_cannot_be_drawn_are_refused() {
        let mut c = two_by_two();
        c.cells.pop();
        assert!(c
            .check()
            .unwrap_err()
            .to_string()
            .contains("1 rows for 2 groups"));
        let mut c = two_by_two();
        c.cells[1].pop();
        assert!(c.check().unwrap_err().to_string().starts_with("cells[1]"));
        let mut c = two_by_two();
        c.cells[0][1].value = Some(-1.0);
        assert!(c.draw().unwrap_err().to_string().starts_with("cells[0][1]"));
        let mut c = two_by_two();
        c.cells[0][1].value = Some(f64::NAN);
        assert!(c.check().is_err());
        let mut c = two_by_two();
        c.cells[0][1].text = Some("FAIL".into());
        assert!(c
            .check()
            .unwrap_err()
            .to_string()
            .contains("either a text or amounts"));
        let mut c = two_by_two();
        c.series[0].color = Some("red\" onload=\"x".into());
        assert!(c
            .check()
            .unwrap_err()
            .to_string()
            .starts_with("series[0].color"));
        c.series[0].color = Some("#d62728".into());
        assert!(c.draw().unwrap().contains("fill=\"#d62728\""));
    }

    #[test]
    fn axis_steps_and_ticks() {
        assert_eq!(nice_step(6.0), 1.0);
        assert_eq!(nice_step(13.0), 2.5);
        assert_eq!(nice_step(2.4), 0.5);
        assert_eq!(general(0.1 + 0.2), "0.3");
        assert_eq!(general(2.5), "2.5");
        assert_eq!(general(800.0), "800");
        assert_eq!(tick_label(12_000.0), "12k");
        assert_eq!(tick_label(35_000_000.0), "35M");
    }
}
