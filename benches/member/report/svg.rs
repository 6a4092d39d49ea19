//! bench/latency.svg: p50 and p99 bars of the negative-path and mixed loads, libmember next to
//! its GET baseline.

use std::fmt::Write as _;

pub(crate) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A horizontal bar chart: per load, a light p99 bar with the p50 bar drawn over it.
pub(crate) fn latency_svg(bars: &[(String, f64, f64, bool)], subtitle: &str) -> String {
    let (left, chart_w, row_h, top) = (330.0, 520.0, 30.0, 70.0);
    let width = left + chart_w + 90.0;
    let height = top + row_h * bars.len() as f64 + 60.0;
    let max = bars.iter().map(|b| b.2).fold(0.0, f64::max).max(1e-3);
    // A round axis maximum: 1, 2 or 5 × 10^k.
    let mag = 10f64.powf(max.log10().floor());
    let axis_max = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|m| *m >= max)
        .unwrap_or(10.0 * mag);
    let x = |v: f64| left + v / axis_max * chart_w;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="white"/>
<text x="20" y="24" font-size="16" font-weight="bold">libmember: request latency, p50 (dark) and p99 (light), ms</text>
<text x="20" y="44" fill="#555">{}</text>"##,
        xml_escape(subtitle)
    );
    for i in 0..=5 {
        let v = axis_max * i as f64 / 5.0;
        let xx = x(v);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            top + row_h * bars.len() as f64,
            top + row_h * bars.len() as f64 + 16.0,
            format_axis(v)
        );
    }
    for (i, (label, p50, p99, lib)) in bars.iter().enumerate() {
        let y = top + row_h * i as f64;
        let (dark, light) = if *lib {
            ("#d9480f", "#ffc9a8")
        } else {
            ("#1c7ed6", "#a5d8ff")
        };
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>
<rect x="{left}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{light}"/>
<rect x="{left}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{dark}"/>
<text x="{:.1}" y="{:.1}" fill="#333">{p50:.3} / {p99:.3}</text>"##,
            left - 8.0,
            y + row_h * 0.6,
            xml_escape(label),
            y + 4.0,
            (x(*p99) - left).max(1.0),
            row_h - 8.0,
            y + 9.0,
            (x(*p50) - left).max(1.0),
            row_h - 18.0,
            x(*p99) + 6.0,
            y + row_h * 0.6,
        );
    }
    let ly = top + row_h * bars.len() as f64 + 40.0;
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{:.1}" width="12" height="12" fill="#1c7ed6"/><text x="{:.1}" y="{ly:.1}">GET (baseline)</text>
<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="#d9480f"/><text x="{:.1}" y="{ly:.1}">MEMBER.EXISTS</text>
<text x="{:.1}" y="{ly:.1}" fill="#555">labels: p50 / p99 ms</text>
</svg>"##,
        ly - 10.0,
        left + 18.0,
        left + 140.0,
        ly - 10.0,
        left + 158.0,
        left + 280.0,
    );
    s
}

pub(crate) fn format_axis(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}
