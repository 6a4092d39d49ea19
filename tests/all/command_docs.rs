//! COMMAND DOCS against the commands reference: every public MEMBER.* command the server knows
//! has docs/commands.md's summary, the module's version as `since`, the group `module`, and
//! arguments that, written out, give the reference's syntax; the internal ones are documented
//! and say they are internal.
use crate::support;

use redis::{Connection, Value};
use support::member::*;

/// A reply reduced to text and lists (RESP2 maps are flat lists, RESP3 ones become the same).
#[derive(Clone, Debug)]
enum Doc {
    Text(String),
    List(Vec<Doc>),
}

impl Doc {
    fn of(v: &Value) -> Doc {
        match v {
            Value::BulkString(b) => Doc::Text(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Doc::Text(s.clone()),
            Value::Int(i) => Doc::Text(i.to_string()),
            Value::Array(a) | Value::Set(a) => Doc::List(a.iter().map(Doc::of).collect()),
            Value::Map(m) => Doc::List(
                m.iter()
                    .flat_map(|(k, v)| [Doc::of(k), Doc::of(v)])
                    .collect(),
            ),
            other => panic!("unexpected reply {other:?}"),
        }
    }
    fn text(&self) -> &str {
        match self {
            Doc::Text(s) => s,
            Doc::List(l) => panic!("not a text: {l:?}"),
        }
    }
    fn list(&self) -> &[Doc] {
        match self {
            Doc::List(l) => l,
            Doc::Text(s) => panic!("not a list: {s}"),
        }
    }
    /// A field of a map.
    fn get(&self, name: &str) -> Option<&Doc> {
        self.list()
            .chunks(2)
            .find(|p| p[0].text() == name)
            .map(|p| &p[1])
    }
}

/// `COMMAND DOCS <name>`: the command's map of fields.
fn docs(c: &mut Connection, name: &str) -> Doc {
    let v: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg(name)
        .query(c)
        .unwrap();
    let reply = Doc::of(&v);
    reply
        .get(name)
        .unwrap_or_else(|| panic!("COMMAND DOCS {name} has no entry: {reply:?}"))
        .clone()
}

/// An argument written as docs/commands.md writes it (the module's `command/docs.rs` rules,
/// here from what the server reports).
fn written(a: &Doc) -> String {
    let flags: Vec<&str> = a
        .get("flags")
        .map(|f| f.list().iter().map(Doc::text).collect())
        .unwrap_or_default();
    let token = a.get("token").map(Doc::text);
    let value = match a.get("type").unwrap().text() {
        "pure-token" => String::new(),
        "oneof" => {
            let of = a.get("arguments").unwrap().list();
            let pure = of
                .iter()
                .all(|o| o.get("type").unwrap().text() == "pure-token");
            let alts: Vec<String> = of.iter().map(written).collect();
            let alts = alts.join(if pure { "|" } else { " | " });
            if flags.contains(&"optional") || token.is_some() || of.len() == 1 {
                alts
            } else {
                format!("({alts})")
            }
        }
        "block" => {
            let of = a.get("arguments").unwrap().list();
            of.iter().map(written).collect::<Vec<_>>().join(" ")
        }
        // Redis 7.0 does not report display_text: `<>` there (see `masked`).
        _ => format!("<{}>", a.get("display_text").map_or("", Doc::text)),
    };
    let value = if flags.contains(&"multiple") {
        format!("{value} [{value} …]")
    } else {
        value
    };
    let s = match (token, value.is_empty()) {
        (Some(t), true) => t.to_string(),
        (Some(t), false) => format!("{t} {value}"),
        (None, _) => value,
    };
    if flags.contains(&"optional") {
        format!("[{s}]")
    } else {
        s
    }
}

/// The `## Summary` table of docs/commands.md: (command name, syntax, summary).
fn reference() -> Vec<(String, String, String)> {
    let doc = include_str!("../../docs/commands.md");
    let table = doc.split("\n## Summary\n").nth(1).unwrap();
    let table = table.split("\n## ").next().unwrap();
    table
        .lines()
        .filter(|l| l.starts_with("| `MEMBER."))
        .map(|l| {
            let cells: Vec<String> = l
                .replace("\\|", "\u{1}")
                .split('|')
                .map(|c| c.trim().replace('\u{1}', "|"))
                .collect();
            let syntax = cells[1].trim_matches('`').to_string();
            let name = syntax.split(' ').next().unwrap().to_ascii_lowercase();
            (name, syntax, cells[2].clone())
        })
        .collect()
}

/// The syntax with every placeholder emptied: `<set>` → `<>`.
fn masked(syntax: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for ch in syntax.chars() {
        match ch {
            '<' => {
                inside = true;
                out.push(ch);
            }
            '>' => {
                inside = false;
                out.push(ch);
            }
            _ if inside => {}
            _ => out.push(ch),
        }
    }
    out
}

fn top_level_names(d: &Doc) -> Vec<String> {
    d.get("arguments")
        .unwrap()
        .list()
        .iter()
        .map(|a| a.get("name").unwrap().text().to_string())
        .collect()
}

#[test]
fn command_docs_of_every_command_match_the_commands_reference() {
    let env = Env::new();
    let mut c = env.conn();
    let reference = reference();
    let listed = module_commands(&mut c);
    let (internal, public): (Vec<String>, Vec<String>) =
        listed.into_iter().partition(|n| n.starts_with("member._"));
    let mut documented: Vec<String> = reference.iter().map(|r| r.0.clone()).collect();
    documented.sort();
    assert_eq!(public, documented, "public commands vs docs/commands.md");
    let since = env!("CARGO_PKG_VERSION");
    // COMMAND DOCS shows display_text from Redis 7.2 (and on every Valkey); before that the
    // placeholders' names are missing, and only the rest of the syntax can be compared.
    let server = support::server_version(&mut c);
    let display_text = server.valkey || server.redis_at_least((7, 2, 0));
    if !display_text {
        eprintln!(
            "{server} has no display_text: placeholders are not compared (checked on Valkey)"
        );
    }
    for (name, syntax, summary) in &reference {
        let d = docs(&mut c, name);
        assert_eq!(
            d.get("summary").map(Doc::text),
            Some(summary.as_str()),
            "{name}"
        );
        assert_eq!(d.get("since").map(Doc::text), Some(since), "{name}");
        assert_eq!(d.get("group").map(Doc::text), Some("module"), "{name}");
        assert_eq!(d.get("module").map(Doc::text), Some("member"), "{name}");
        let args: Vec<String> = d
            .get("arguments")
            .unwrap_or_else(|| panic!("{name} has no arguments"))
            .list()
            .iter()
            .map(written)
            .collect();
        let got = format!("{} {}", name.to_ascii_uppercase(), args.join(" "));
        if !display_text {
            // The tokens, choices, optional and repeated arguments still match.
            assert_eq!(
                got,
                masked(syntax),
                "{name}: COMMAND DOCS vs docs/commands.md"
            );
        } else {
            assert_eq!(&got, syntax, "{name}: COMMAND DOCS vs docs/commands.md");
        }
    }
    // The names, which the written syntax does not show where a placeholder replaces them.
    let names = |c: &mut Connection, cmd: &str| top_level_names(&docs(c, cmd));
    assert_eq!(names(&mut c, "member.exists"), ["set", "item", "scope"]);
    assert_eq!(
        names(&mut c, "member.madd"),
        ["set", "scope", "expiry", "item"]
    );
    assert_eq!(names(&mut c, "member.alter"), ["set", "alteration"]);
    assert!(docs(&mut c, "member.exists").get("complexity").is_some());
    for name in &internal {
        let d = docs(&mut c, name);
        let summary = d.get("summary").map(Doc::text).unwrap_or_default();
        assert!(summary.starts_with("Internal"), "{name}: {summary}");
        assert_eq!(d.get("since").map(Doc::text), Some(since), "{name}");
    }
    assert_eq!(internal.len(), 6, "{internal:?}");
}
