//! Command-line options of the bench (`cargo bench --bench member -- --help`) and the
//! small helpers that report on them: `die`, `progress`.

use crate::*;

pub(crate) struct Opts {
    pub(crate) members: u64,
    /// Seconds of load per side of each comparison (split over two runs).
    pub(crate) secs: f64,
    pub(crate) workers: Option<u32>,
    pub(crate) fpr_probes: u64,
    /// Sections to run (all when None); a partial run prints its table and writes no files.
    pub(crate) only: Option<Vec<String>>,
    /// `--hundred-million`: the filter-level rows at 100 M members only, no servers.
    pub(crate) hundred_million: bool,
}

impl Opts {
    pub(crate) fn runs(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|s| s == section))
    }
}

pub(crate) const USAGE: &str = "usage: cargo bench --bench member -- [--ten-million | --hundred-million] [--members N] \
     [--seconds S] [--workers N] [--fpr-probes N] [--only SECTIONS]
  --ten-million   load 10 000 000 members instead of 1 000 000
  --hundred-million  only the filter-level rows at 100 000 000 members (no servers: this
                  machine cannot load such a table); prints its own table
  --members N     load N members
  --seconds S     seconds of load per side of each comparison (default 4)
  --workers N     member.workers for the module (default: the module's default)
  --fpr-probes N  absent probes for the measured false-positive rate (default 1 000 000)
  --only SECTIONS run only these, comma-separated: memory,negative,mixed,cold,dbcpu,rebuild,writes,writepath,bigfilter,idle,batch,
                  tokenize,replica,normalize,visibility,syncmem,rebuildmem,pooler,cluster
                  (prints the table; bench/results.md and the chart are kept as they are)";

impl Opts {
    pub(crate) fn parse() -> Opts {
        // `cargo bench` passes --bench; `cargo test --all-targets` (make test) runs this binary
        // too, without it and with the test harness' arguments: do nothing there.
        if !std::env::args().any(|a| a == "--bench") {
            println!("bench member: not run under `cargo test`; use `make bench`");
            std::process::exit(0);
        }
        let mut o = Opts {
            members: 1_000_000,
            secs: 4.0,
            workers: None,
            fpr_probes: 1_000_000,
            only: None,
            hundred_million: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = |name: &str| -> String {
                args.next()
                    .unwrap_or_else(|| die(&format!("{name} needs a value")))
            };
            match a.as_str() {
                // `cargo bench` passes --bench to harness = false targets.
                "--bench" => {}
                "--ten-million" => o.members = 10_000_000,
                "--hundred-million" => o.hundred_million = true,
                "--members" => o.members = parse_num(&value("--members")),
                "--seconds" => {
                    o.secs = value("--seconds")
                        .parse()
                        .unwrap_or_else(|_| die("--seconds needs a number"))
                }
                "--workers" => o.workers = Some(parse_num(&value("--workers")) as u32),
                "--fpr-probes" => o.fpr_probes = parse_num(&value("--fpr-probes")),
                "--only" => {
                    let list: Vec<String> = value("--only")
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .collect();
                    let names: Vec<&str> = SECTIONS.iter().map(|(n, _)| *n).collect();
                    if let Some(bad) = list.iter().find(|s| !names.contains(&s.as_str())) {
                        die(&format!(
                            "--only: unknown section {bad:?} (one of {names:?})"
                        ));
                    }
                    o.only = Some(list);
                }
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => die(&format!("unknown argument {other:?}")),
            }
        }
        if o.members < 1000 {
            die("--members must be at least 1000");
        }
        if o.secs.is_nan() || o.secs < 0.5 {
            die("--seconds must be at least 0.5");
        }
        o
    }
}

pub(crate) fn parse_num(s: &str) -> u64 {
    s.replace(['_', ','], "")
        .parse()
        .unwrap_or_else(|_| die(&format!("not a number: {s}")))
}

pub(crate) fn die(msg: &str) -> ! {
    eprintln!("bench: {msg}\n{USAGE}");
    std::process::exit(2);
}

pub(crate) fn progress(msg: &str) {
    eprintln!("[bench] {msg}");
}
