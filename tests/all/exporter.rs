//! The monitoring files of contrib/ against the real tools: Debian's redis_exporter runs
//! `contrib/prometheus/libmember.lua` against a server with the module and shows the per-set
//! and module-wide fields; every metric the alert rules and the dashboard read is one it shows;
//! promtool accepts the rules and their unit tests pass.
use crate::support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::cluster::Cluster;
use support::member::*;

fn contrib(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("contrib")
        .join(path)
}

/// A redis_exporter child running the contrib script against one server; killed on drop.
struct Exporter {
    child: Child,
    port: u16,
}

impl Exporter {
    /// The exporter running contrib/prometheus/libmember.lua against the server on `server_port`.
    fn start(server_port: u16) -> Exporter {
        Exporter::with_script(server_port, &contrib("prometheus/libmember.lua"))
    }

    fn with_script(server_port: u16, script: &Path) -> Exporter {
        let port = support::free_port();
        let child = Command::new("prometheus-redis-exporter")
            .arg(format!("--redis.addr=redis://127.0.0.1:{server_port}"))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!("--script={}", script.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-redis-exporter (scripts/install-deps.sh installs it)");
        Exporter { child, port }
    }

    /// The body of one GET /metrics, or None while the exporter is not listening yet.
    fn scrape(&self) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.0 200")
            .then(|| body.to_string())
            .or_else(|| head.starts_with("HTTP/1.1 200").then(|| body.to_string()))
    }

    /// A scrape once the exporter is up and has reached the server (`redis_up 1`), parsed.
    fn metrics(&self) -> Metrics {
        let mut body = None;
        let up = support::wait_until(Duration::from_secs(30), || {
            body = self.scrape();
            body.as_deref()
                .is_some_and(|b| b.lines().any(|l| l == "redis_up 1"))
        });
        let m = parse(&body.unwrap_or_default());
        assert!(up, "the exporter never reported redis_up 1:\n{}", m.text);
        assert!(
            m.text
                .lines()
                .any(|l| l.starts_with("redis_exporter_last_scrape_error") && l.ends_with(" 0")),
            "the script failed the scrape:\n{}",
            m.text
        );
        m
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One scrape, parsed: the metric names printed, and the script's values by their `key`.
struct Metrics {
    names: Vec<String>,
    keys: HashMap<String, f64>,
    text: String,
}

fn parse(text: &str) -> Metrics {
    let mut names = Vec::new();
    let mut keys = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("name and value");
        let name = series.split('{').next().unwrap().to_string();
        if name == "redis_script_values" {
            let key = series
                .split_once("key=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(k, _)| k.to_string())
                .expect("a key label");
            keys.insert(key, value.parse().expect("a number"));
        }
        names.push(name);
    }
    Metrics {
        names,
        keys,
        text: text.to_string(),
    }
}

impl Metrics {
    fn get(&self, key: &str) -> f64 {
        *self
            .keys
            .get(key)
            .unwrap_or_else(|| panic!("{key} not exported:\n{}", self.text))
    }
}

#[test]
fn exporter_shows_every_sets_fields_and_info_member() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "exp_users", "ERROR", "0.01"]);
    ok(&mut c, &["MEMBER.CREATE", "exp_orgs"]);
    for item in ["ann", "bob", "cid"] {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "exp_users", item]), 1);
    }
    // 40 lookups: one call in eight is timed, so the percentiles have samples.
    let lookups: Vec<&str> = ["ann", "bob", "zed", "yan"].repeat(10);
    for item in &lookups {
        int(&mut c, &["MEMBER.EXISTS", "exp_users", item]);
    }

    let m = Exporter::start(env.vk.port()).metrics();

    // Module-wide: INFO member's numeric fields and its text fields as 0/1.
    assert_eq!(m.get("member_sets"), 2.0);
    assert_eq!(m.get("member_catalog_loaded"), 1.0);
    assert!(m.get("member_exists_calls") >= lookups.len() as f64);
    assert!(m.get("member_max_blocked_clients") > 0.0);
    // (Five sampled calls; a fast one may round to 0 µs, the slowest does not.)
    assert!(m.get("member_exists_p999_us") > 0.0);
    assert!(m.get("member_exists_p999_us") >= m.get("member_exists_p50_us"));
    assert_eq!(m.get("member_db_timeouts"), 0.0);
    assert_eq!(m.get("member_db_link_failing"), 0.0);
    assert_eq!(m.get("member_sync_horizon_blind"), 0.0);
    assert_eq!(m.get("member_script_sets"), 2.0);
    assert_eq!(m.get("member_script_set_errors"), 0.0);

    // Per set, the set in the key.
    let s = |f: &str| m.get(&format!("member_set:exp_users:{f}"));
    assert_eq!(s("error_rate"), 0.01);
    assert_eq!(s("exists_calls"), lookups.len() as f64);
    let paths = [
        "bloom_negative",
        "recent",
        "cache_hit",
        "fp_cache",
        "db_hit",
        "db_miss",
    ];
    let decided: f64 = paths.iter().map(|p| s(&format!("path_{p}"))).sum();
    assert_eq!(decided, lookups.len() as f64, "every lookup has one path");
    assert!(s("filter_items") >= 3.0);
    assert!(s("filter_fill") > 0.0 && s("filter_fill") < 1.0);
    assert!(s("filter_fpr_est") >= 0.0 && s("filter_fpr_est") < 0.01);
    assert_eq!(s("filter_serves_absent"), 1.0);
    assert_eq!(s("filter_origin_here"), 1.0);
    assert_eq!(s("sync_horizon_blind"), 0.0);
    assert_eq!(s("last_rebuild_failed"), 0.0);
    assert_eq!(s("rebuild_running"), 0.0);
    assert_eq!(m.get("member_set:exp_orgs:exists_calls"), 0.0);

    // Every metric the alert rules and the dashboard read is one the exporter printed.
    let alerts = std::fs::read_to_string(contrib("prometheus/alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(contrib("grafana/libmember.json")).unwrap();
    let mut exprs = yaml_exprs(&alerts);
    assert!(exprs.len() >= 6, "alert rules: {exprs:?}");
    let panels = json_exprs(&dashboard);
    assert!(panels.len() >= 5, "dashboard queries: {panels:?}");
    exprs.extend(panels);
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(
                m.names.contains(&name),
                "{name} (in `{expr}`) is not a metric the exporter printed"
            );
        }
        for matcher in key_matchers(expr) {
            for key in expand(&matcher, "exp_users") {
                assert!(
                    m.keys.contains_key(&key),
                    "{key} (from `{matcher}` in `{expr}`) is not a key the script returned"
                );
            }
        }
    }
}

/// In cluster mode the script as shipped reports every set the node holds (MEMBER.NODEINFO
/// lists them), each node its own part; with a set listed in its `SETS` table, that one.
#[test]
fn exporter_in_cluster_mode_reports_each_nodes_part_of_every_set() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "exp_cluster";
    cl.create_everywhere(set);
    cl.wait_ready(set);
    let node = cl.primaries().next().unwrap();

    let m = Exporter::start(node.port()).metrics();
    assert!(m.get("member_script_sets") >= 1.0);
    assert_eq!(m.get("member_script_set_errors"), 0.0);
    assert!(m.get(&format!("member_set:{set}:cluster_slots_owned")) > 0.0);

    let shipped = std::fs::read_to_string(contrib("prometheus/libmember.lua")).unwrap();
    let listed = shipped.replace("local SETS = {}", &format!("local SETS = {{'{set}'}}"));
    assert_ne!(listed, shipped, "no `local SETS = {{}}` in the script");
    let path = std::env::temp_dir().join(format!("member-exporter-{}.lua", std::process::id()));
    std::fs::write(&path, listed).unwrap();
    let m = Exporter::with_script(node.port(), &path).metrics();
    let _ = std::fs::remove_file(&path);
    assert_eq!(m.get("member_script_sets"), 1.0);
    assert_eq!(m.get("member_script_set_errors"), 0.0);
    let s = |f: &str| m.get(&format!("member_set:{set}:{f}"));
    assert!(s("cluster_slots_owned") > 0.0);
    assert_eq!(s("cluster_slots_ready"), s("cluster_slots_owned"));
    assert_eq!(s("filter_present"), 1.0);
    assert_eq!(s("filter_serves_absent"), 1.0);

    let mut c = cl.set_owner(set).conn();
    ok(&mut c, &["MEMBER.DROP", set]);
}

/// The `expr:` of every rule (one line, or a `|` block of the lines indented below it).
fn yaml_exprs(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest == "|" || rest == ">" {
            let indent = line.len() - line.trim_start().len();
            let block: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .map(|l| l.trim())
                .collect();
            out.push(block.join(" "));
        } else {
            out.push(rest.trim_matches('\'').to_string());
        }
    }
    out
}

/// The `"expr"` of every dashboard query, JSON escapes of quotes and backslashes undone.
fn json_exprs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in text.split("\"expr\":").skip(1) {
        let s = part.trim_start().strip_prefix('"').expect("a string");
        let mut expr = String::new();
        let mut chars = s.chars();
        while let Some(ch) = chars.next() {
            match ch {
                '\\' => expr.push(chars.next().unwrap()),
                '"' => break,
                _ => expr.push(ch),
            }
        }
        out.push(expr);
    }
    out
}

/// Metric names in a PromQL expression: the words in the exporter's namespace `redis_`.
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'))
        .filter(|w| w.starts_with("redis_"))
        .map(str::to_string)
        .collect()
}

/// The values of `key="…"` and `key=~"…"` matchers (regexes keep their `~`).
fn key_matchers(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in expr.match_indices("key=") {
        if i > 0 && expr[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &expr[i + 4..];
        let (re, rest) = match rest.strip_prefix('~') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let value = rest[1..].split('"').next().unwrap();
        out.push(if re {
            format!("~{value}")
        } else {
            value.into()
        });
    }
    out
}

/// The keys a matcher selects for a set named `set`. Regexes may use only the forms the
/// contrib files use: `[a-z0-9_]+` for the set and one `(a|b|…)` group of field names.
fn expand(matcher: &str, set: &str) -> Vec<String> {
    let Some(re) = matcher.strip_prefix('~') else {
        return vec![matcher.to_string()];
    };
    let re = re.replace("[a-z0-9_]+", set);
    let expanded: Vec<String> = match (re.find('('), re.find(')')) {
        (Some(a), Some(b)) => re[a + 1..b]
            .split('|')
            .map(|alt| format!("{}{alt}{}", &re[..a], &re[b + 1..]))
            .collect(),
        _ => vec![re.clone()],
    };
    for k in &expanded {
        assert!(
            k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "a regex beyond the forms this check reads: {matcher}"
        );
    }
    expanded
}

/// `promtool check rules` accepts the alert rules and `promtool test rules` passes their unit
/// tests (each alert firing, or not, on synthetic series).
#[test]
fn promtool_accepts_the_rules_and_their_tests_pass() {
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(contrib("prometheus"))
            .output()
            .expect("promtool (scripts/install-deps.sh installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every query of the dashboard is valid PromQL: promtool checks them as recording rules
/// (Grafana's `$__rate_interval` replaced by a fixed range).
#[test]
fn promtool_parses_every_dashboard_query() {
    let dashboard = std::fs::read_to_string(contrib("grafana/libmember.json")).unwrap();
    // Every query is found, and there are some: a dashboard read as having none would pass.
    let exprs = json_exprs(&dashboard);
    let keys = dashboard.matches("\"expr\"").count();
    assert!(
        !exprs.is_empty() && exprs.len() == keys,
        "{} dashboard queries read of {keys} \"expr\" keys",
        exprs.len()
    );
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        let expr = expr.replace("$__rate_interval", "5m").replace('\'', "''");
        rules.push_str(&format!(
            "      - record: dashboard_query_{i}\n        expr: '{expr}'\n"
        ));
    }
    let path = std::env::temp_dir().join(format!("member-dashboard-{}.yml", std::process::id()));
    std::fs::write(&path, rules).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool (scripts/install-deps.sh installs it)");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "promtool check rules on the dashboard's queries:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
