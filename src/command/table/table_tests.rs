//! The command table's own rules, and docs/commands.md's Summary table held to it.

use crate::command::table::docs::syntax;
use crate::command::table::*;

#[test]
fn names_are_unique_lower_case_and_found_in_any_case() {
    for (i, c) in COMMANDS.iter().enumerate() {
        assert_eq!(c.name, c.name.to_ascii_lowercase());
        assert!(c.name.starts_with("member."), "{}", c.name);
        assert!(COMMANDS[..i].iter().all(|d| d.name != c.name), "{}", c.name);
        assert_eq!(
            find(c.name.to_ascii_uppercase().as_bytes()).unwrap().name,
            c.name
        );
    }
    assert!(find(b"member.nope").is_none());
}

#[test]
fn internal_commands_are_the_underscored_ones() {
    for c in COMMANDS {
        assert_eq!(
            c.name.starts_with("member._"),
            c.audience == Audience::Internal,
            "{}",
            c.name
        );
    }
}

#[test]
fn every_row_is_documented_with_unique_argument_names() {
    fn check(name: &str, args: &[Arg]) {
        for (i, a) in args.iter().enumerate() {
            assert!(!a.name.is_empty(), "{name}");
            assert!(
                args[..i].iter().all(|b| b.name != a.name),
                "{name}: {}",
                a.name
            );
            assert_eq!(
                a.inner().is_some_and(|of| !of.is_empty()),
                a.inner().is_some()
            );
            check(name, a.inner().unwrap_or_default());
        }
    }
    for c in COMMANDS {
        assert!(!c.docs.summary.is_empty(), "{} has no summary", c.name);
        assert!(!c.docs.args.is_empty(), "{} has no arguments", c.name);
        check(c.name, c.docs.args);
    }
}

/// The rows of the `## Summary` table of docs/commands.md: (command cell, summary cell),
/// the cells unescaped (`\|` is a `|` inside a cell) and without their backticks.
fn documented() -> Vec<(String, String)> {
    let doc = include_str!("../../../docs/commands.md");
    let table = doc
        .split("\n## Summary\n")
        .nth(1)
        .expect("a Summary section");
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
            (cells[1].trim_matches('`').to_string(), cells[2].clone())
        })
        .collect()
}

#[test]
fn docs_commands_md_lists_every_public_command_as_the_table_documents_it() {
    let rows = documented();
    let missing: Vec<String> = COMMANDS
        .iter()
        .filter(|c| c.audience == Audience::Public)
        .map(|c| (syntax(c.name, c.docs.args), c.docs.summary.to_string()))
        .filter(|want| !rows.contains(want))
        .map(|(cmd, summary)| format!("| `{}` | {summary} |", cmd.replace('|', "\\|")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/commands.md's Summary table lacks these rows (command, summary):\n{}",
        missing.join("\n")
    );
    for (cmd, _) in &rows {
        let name = cmd.split(' ').next().unwrap().to_ascii_lowercase();
        assert!(
            find(name.as_bytes()).is_some_and(|c| c.audience == Audience::Public),
            "docs/commands.md lists {name}, which is no public command"
        );
    }
    assert_eq!(
        rows.len(),
        COMMANDS
            .iter()
            .filter(|c| c.audience == Audience::Public)
            .count()
    );
}

#[test]
fn only_the_hot_paths_have_entry_points_of_their_own() {
    for c in COMMANDS {
        assert_eq!(
            matches!(c.run, Run::Raw(_)),
            c.name == EXISTS.name || c.name == MEXISTS.name,
            "{}",
            c.name
        );
    }
}
