//! Hand-written SVG charts for `scan` (ratio against speed) and `tco`
//! (cost bars): no plotting dependency, readable output, fixed palette.

use std::fmt::Write;

const W: f64 = 760.0;
const H: f64 = 460.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn header(title: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        esc(title)
    );
    s
}

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
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let fx =
        |x: f64| LEFT + (x.max(xmin).log10() - xmin.log10()) / (xmax.log10() - xmin.log10()) * pw;
    let fy = |y: f64| TOP + ph - y / ymax * ph;
    let mut s = header(title);
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
        H - 18.0,
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

/// Grouped bars: one group per category, one bar per series. Series:
/// (name, one value per category).
pub fn bars(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> String {
    let vmax = nice_max(
        series
            .iter()
            .flat_map(|s| s.1.iter().copied())
            .fold(0.0, f64::max),
    );
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let fy = |v: f64| TOP + ph - v / vmax * ph;
    let mut s = header(title);
    for i in 0..=5 {
        let v = vmax * f64::from(i) / 5.0;
        let y = fy(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            short(v)
        );
    }
    let groups = categories.len().max(1) as f64;
    let gw = pw / groups;
    let bw = gw * 0.8 / series.len().max(1) as f64;
    for (ci, cat) in categories.iter().enumerate() {
        let gx = LEFT + gw * ci as f64 + gw * 0.1;
        for (si, (name, vals)) in series.iter().enumerate() {
            let v = vals.get(ci).copied().unwrap_or(0.0);
            let c = PALETTE[si % PALETTE.len()];
            let x = gx + bw * si as f64;
            let y = fy(v);
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{c}"><title>{} {}: {}</title></rect>"#,
                bw * 0.95,
                TOP + ph - y,
                esc(cat),
                esc(name),
                short(v)
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                x + bw * 0.475,
                y - 3.0,
                short(v)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            gx + gw * 0.4,
            TOP + ph + 16.0,
            esc(cat)
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    for (i, (name, _)) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
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
