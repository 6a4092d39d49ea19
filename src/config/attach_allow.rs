//! `member.attach-allow` (docs/attach.md, "Which tables may be attached"): the tables an
//! operator lets MEMBER.CREATE … SOURCE attach, as `schema.table` patterns, and their matcher.
//! Empty by default: no table may be attached until the operator names it.
//!
//! Syntax: patterns separated by commas and/or spaces; each is `<schema>.<table>`, split at its
//! first dot (so a table name may hold further dots), both parts non-empty; `*` in a part
//! matches any run of characters (none included) within that part, every other character only
//! itself (names are exact and case-sensitive, as PostgreSQL stores them). `*.*` allows every
//! table the module's role can read — except the module's own relations, which no pattern
//! allows (`db::source_check`).

use std::sync::Mutex;

use redis_module::configuration::ConfigurationContext;
use redis_module::{ConfigurationValue, RedisError, RedisString};

/// One `schema.table` pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pattern {
    schema: String,
    table: String,
}

/// The config: the value as set (CONFIG GET shows it) and its patterns.
pub struct AttachAllow(Mutex<(String, Vec<Pattern>)>);

/// `member.attach-allow`, registered in `config_load`.
pub static ATTACH_ALLOW: AttachAllow = AttachAllow(Mutex::new((String::new(), Vec::new())));

/// Why a value is refused (CONFIG SET's error, or the failed load's log line).
const BAD_VALUE: &str = "member.attach-allow must be <schema>.<table> patterns separated by \
     commas or spaces (`*` matches any characters within a part), without control characters";

/// The patterns of `value`, or `None` when it is malformed: a control byte (NUL included) or
/// invalid UTF-8 anywhere, an entry without a dot, or an empty part.
fn parse(value: &[u8]) -> Option<Vec<Pattern>> {
    if value.iter().any(u8::is_ascii_control) {
        return None;
    }
    let s = std::str::from_utf8(value).ok()?;
    s.split([',', ' '])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (schema, table) = p.split_once('.')?;
            (!schema.is_empty() && !table.is_empty()).then(|| Pattern {
                schema: schema.to_string(),
                table: table.to_string(),
            })
        })
        .collect()
}

/// True when `name` matches the glob `pat` (`*` = any run of characters, none included).
fn glob(pat: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pat.chars().collect(), name.chars().collect());
    // The classic two-pointer match with backtracking to the last star.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

fn matches(patterns: &[Pattern], schema: &str, table: &str) -> bool {
    patterns
        .iter()
        .any(|p| glob(&p.schema, schema) && glob(&p.table, table))
}

/// True when the operator's list allows attaching `schema.table` (exact names).
pub fn allowed(schema: &str, table: &str) -> bool {
    let g = ATTACH_ALLOW.0.lock().unwrap_or_else(|e| e.into_inner());
    matches(&g.1, schema, table)
}

impl ConfigurationValue<RedisString> for AttachAllow {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        RedisString::create(None, g.0.as_str())
    }
    fn set(&self, _: &ConfigurationContext, val: RedisString) -> Result<(), RedisError> {
        let patterns = parse(val.as_slice()).ok_or(RedisError::Str(BAD_VALUE))?;
        let shown = String::from_utf8_lossy(val.as_slice()).into_owned();
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = (shown, patterns);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(list: &str, schema: &str, table: &str) -> bool {
        matches(&parse(list.as_bytes()).expect(list), schema, table)
    }

    #[test]
    fn empty_allows_nothing() {
        assert_eq!(parse(b""), Some(vec![]));
        assert_eq!(parse(b" , ,"), Some(vec![]));
        assert!(!allows("", "public", "users"));
    }

    #[test]
    fn patterns_match_each_part_exactly_or_by_star() {
        let list = "app.users, billing.*  ,*.audit_*";
        assert!(allows(list, "app", "users"));
        assert!(!allows(list, "app", "Users"));
        assert!(!allows(list, "app", "users2"));
        assert!(!allows(list, "App", "users"));
        assert!(allows(list, "billing", "anything.at all"));
        assert!(allows(list, "x", "audit_log"));
        assert!(!allows(list, "x", "audit"));
        assert!(allows("*.*", "weird\"schema", "t"));
        assert!(allows("a*b*c.t", "aXXbYYc", "t"));
        assert!(!allows("a*b*c.t", "aXXbYY", "t"));
        assert!(allows("public.a.b", "public", "a.b"));
        // Each part is matched on its own: a star never reaches across the dot.
        assert!(!allows("app.*", "app2", "users"));
        assert!(!allows("a*.t", "app", "x.t"));
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            &b"app"[..],
            b".users",
            b"app.",
            b"app.users\0",
            b"app.users\tother.t",
            b"app.us\x7fers",
            b"app.\xff",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
