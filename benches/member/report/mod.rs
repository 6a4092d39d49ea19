//! The report: rows of figures (libmember vs baseline, ratio, target), notes, and the number
//! formats they use. `results` writes it out; `svg` draws the latency chart; `machine` describes the host.

use std::fmt::Write as _;

use crate::*;

mod machine;
mod results;
mod svg;

pub(crate) use machine::*;
pub(crate) use svg::*;

pub(crate) struct Row {
    pub(crate) section: &'static str,
    pub(crate) figure: String,
    pub(crate) lib: String,
    pub(crate) base: String,
    pub(crate) ratio: Option<f64>,
    pub(crate) target: String,
    pub(crate) met: Option<bool>,
}

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) rows: Vec<Row>,
    pub(crate) notes: Vec<String>,
    /// (label, p50 ms, p99 ms, is libmember) for the latency chart.
    pub(crate) bars: Vec<(String, f64, f64, bool)>,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn row(
        &mut self,
        section: &'static str,
        figure: impl Into<String>,
        lib: impl Into<String>,
        base: impl Into<String>,
        ratio: Option<f64>,
        target: impl Into<String>,
        met: Option<bool>,
    ) {
        self.rows.push(Row {
            section,
            figure: figure.into(),
            lib: lib.into(),
            base: base.into(),
            ratio,
            target: target.into(),
            met,
        });
    }

    pub(crate) fn note(&mut self, n: impl Into<String>) {
        let n = n.into();
        progress(&format!("note: {n}"));
        self.notes.push(n);
    }

    /// Throughput row (+ latency row) for a pair measured with the same generator.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pair(
        &mut self,
        section: &'static str,
        what: &str,
        lib: &Stats,
        base: &Stats,
        min_ratio: Option<f64>,
        max_p99_ratio: Option<f64>,
        baseline_name: &str,
    ) {
        let ratio = lib.rps() / base.rps().max(1e-9);
        self.row(
            section,
            format!("{what}: ops/s"),
            rate(lib.rps()),
            format!("{} ({baseline_name})", rate(base.rps())),
            Some(ratio),
            min_ratio.map_or("—".into(), |m| format!("≥ {m:.2}×")),
            min_ratio.map(|m| ratio >= m),
        );
        let p99_ratio = lib.p99_ms / base.p99_ms.max(1e-9);
        self.row(
            section,
            format!("{what}: p50 / p99 latency"),
            lat(lib),
            lat(base),
            Some(p99_ratio),
            max_p99_ratio.map_or("—".into(), |m| format!("p99 ≤ {m:.2}×")),
            max_p99_ratio.map(|m| p99_ratio <= m),
        );
        for (st, side) in [(lib, "libmember"), (base, baseline_name)] {
            if st.errors > 0 || st.wrong > 0 {
                self.note(format!(
                    "{what} ({side}): {} error replies, {} wrong answers; first error: {}",
                    st.errors,
                    st.wrong,
                    st.first_error.as_deref().unwrap_or("-")
                ));
            }
        }
    }

    pub(crate) fn table(&self) -> String {
        let mut s = String::new();
        s.push_str("| figure | libmember | baseline | ratio | target | met? |\n");
        s.push_str("|---|---|---|---|---|---|\n");
        let mut section = "";
        for r in &self.rows {
            if r.section != section {
                section = r.section;
                let _ = writeln!(s, "| **{section}** | | | | | |");
            }
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                r.figure,
                r.lib,
                r.base,
                r.ratio.map_or("—".into(), |x| format!("{x:.3}×")),
                r.target,
                match r.met {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "—",
                }
            );
        }
        s
    }
}

pub(crate) fn rate(x: f64) -> String {
    let n = x.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(ch);
    }
    out + "/s"
}

pub(crate) fn lat(s: &Stats) -> String {
    format!("{:.3} / {:.3} ms", s.p50_ms, s.p99_ms)
}

pub(crate) fn thousands(n: u64) -> String {
    rate(n as f64).trim_end_matches("/s").to_string()
}
