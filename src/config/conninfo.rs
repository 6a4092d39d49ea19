//! `member.pg-url` read without a driver: where its password sits (so it can be masked), and
//! the TLS keys (`sslmode`, `sslrootcert`) with libpq's meaning, which the driver only half knows.

use std::ops::Range;

/// What a password is shown as, everywhere. Set back in `member.pg-url`, it means "keep the
/// password already set".
pub const MASK: &str = "***";

/// One `key=value` of a connection string: the key, the decoded value, and where they sit.
#[derive(Clone, Debug, PartialEq)]
struct Param {
    key: String,
    value: String,
    /// The value as written (quotes, escapes and percent-encoding included).
    value_at: Range<usize>,
    /// The whole `key=value`, for dropping the parameter.
    whole: Range<usize>,
}

/// A parsed connection string in either libpq form: `postgres://user:pw@host:port/db?k=v`
/// or `host=... user=... password='...'`. Its errors never quote the text.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    text: String,
    url: bool,
    params: Vec<Param>,
}

/// Why a connection string holding a control character is refused.
pub const CONTROL: &str = "the connection string holds a control character (NUL, tab, line \
     break, ...), as written, quoted or percent-encoded: refused";
impl ConnInfo {
    /// Reads a connection string. Refused: one holding a control character anywhere, as
    /// written or once unquoted or percent-decoded (no NUL byte can reach the driver, a C
    /// string or a reply), and one the grammar refuses. (The length of a config's value is
    /// bounded where it is set, `config_text`: its masked form, read here again at every
    /// connection, may be a few bytes longer.)
    pub fn parse(text: &str) -> Result<ConnInfo, &'static str> {
        if crate::config::text::has_control(text) {
            return Err(CONTROL);
        }
        let params = match url_rest(text) {
            Some(at) => {
                // Every part of a URL is percent-decoded by the driver, not only the ones
                // read here (host, user, database name).
                let all = String::from_utf8_lossy(&percent_decode_bytes(text)).into_owned();
                if crate::config::text::has_control(&all) {
                    return Err(CONTROL);
                }
                url_params(text, at)?
            }
            None => kv_params(text)?,
        };
        if params.iter().any(|p| {
            crate::config::text::has_control(&p.key) || crate::config::text::has_control(&p.value)
        }) {
            return Err(CONTROL);
        }
        Ok(ConnInfo {
            text: text.to_string(),
            url: url_rest(text).is_some(),
            params,
        })
    }

    /// The last value given for `key` (the one the driver uses), decoded.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|p| p.key == key)
            .map(|p| p.value.as_str())
    }

    /// The password given in the string, if any.
    pub fn password(&self) -> Option<&str> {
        self.get("password")
    }

    /// The text with every password replaced by [`MASK`]: safe to show anywhere.
    pub fn masked(&self) -> String {
        let mut out = self.text.clone();
        for p in self.params.iter().rev().filter(|p| p.key == "password") {
            // A quoted key=value password may be followed by the next key with no space
            // (`password='pw'user=u`): its mask keeps the quotes, or it would swallow that key.
            let quoted = !self.url && self.text[p.value_at.clone()].starts_with('\'');
            let joined = self.text[p.value_at.end..]
                .chars()
                .next()
                .is_some_and(|c| !c.is_whitespace());
            let mask = if quoted && joined { "'***'" } else { MASK };
            out.replace_range(p.value_at.clone(), mask);
        }
        out
    }

    /// The text without the parameters named in `keys` (for the driver, which refuses the
    /// TLS keys it does not know).
    pub fn without(&self, keys: &[&str]) -> String {
        let keep = |p: &&Param| !keys.contains(&p.key.as_str());
        if !self.url {
            let kept: Vec<&str> = self
                .params
                .iter()
                .filter(keep)
                .map(|p| &self.text[p.whole.clone()])
                .collect();
            let out = kept.join(" ");
            // A key spelled like a URL scheme (`postgres://=x`, after white space the join
            // drops) must not turn the key=value text into a URL for the driver.
            return match url_rest(&out) {
                Some(_) => format!(" {out}"),
                None => out,
            };
        }
        // URL: the userinfo password is not a query parameter and is never dropped here.
        let Some(q) = self.query_start() else {
            return self.text.clone();
        };
        let kept: Vec<&str> = self
            .params
            .iter()
            .filter(|p| p.whole.start > q)
            .filter(keep)
            .map(|p| &self.text[p.whole.clone()])
            .collect();
        let base = &self.text[..q];
        match kept.is_empty() {
            true => base.to_string(),
            false => format!("{base}?{}", kept.join("&")),
        }
    }

    /// Byte offset of the `?` opening a URL's query.
    fn query_start(&self) -> Option<usize> {
        let at = url_rest(&self.text)?;
        let after_creds = at + self.text[at..].find('@').map_or(0, |i| i + 1);
        self.text[after_creds..].find('?').map(|i| after_creds + i)
    }
}

/// Where a URL's text starts after the scheme, or None for the key=value form.
fn url_rest(text: &str) -> Option<usize> {
    ["postgres://", "postgresql://"]
        .iter()
        .find(|p| text.starts_with(*p))
        .map(|p| p.len())
}

/// The URL's userinfo password and its query parameters, split as the driver splits them:
/// the credentials end at the first `@`, the query starts at the next `?`.
fn url_params(text: &str, at: usize) -> Result<Vec<Param>, &'static str> {
    let mut params = Vec::new();
    let mut rest = at;
    if let Some(a) = text[at..].find('@') {
        let creds = at..at + a;
        if let Some(c) = text[creds.clone()].find(':') {
            let value_at = creds.start + c + 1..creds.end;
            params.push(Param {
                key: "password".into(),
                value: percent_decode(&text[value_at.clone()])?,
                whole: value_at.start - 1..value_at.end,
                value_at,
            });
        }
        rest = creds.end + 1;
    }
    let Some(q) = text[rest..].find('?') else {
        return Ok(params);
    };
    let mut start = rest + q + 1;
    while start < text.len() {
        let end = text[start..].find('&').map_or(text.len(), |i| start + i);
        let eq = text[start..end]
            .find('=')
            .ok_or("a URL parameter has no `=`")?;
        let value_at = start + eq + 1..end;
        params.push(Param {
            key: percent_decode(&text[start..start + eq])?,
            value: percent_decode(&text[value_at.clone()])?,
            value_at,
            whole: start..end,
        });
        start = end + 1;
    }
    Ok(params)
}

fn percent_decode(s: &str) -> Result<String, &'static str> {
    String::from_utf8(percent_decode_bytes(s))
        .map_err(|_| "a percent-encoded URL part is not UTF-8")
}

/// `%XX` turned into its byte, everything else kept.
fn percent_decode_bytes(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// key=value pairs separated by whitespace; a value is bare (backslash escapes) or quoted
/// with `'` (backslash escapes inside): the driver's grammar, char by char.
fn kv_params(text: &str) -> Result<Vec<Param>, &'static str> {
    let mut it = text.char_indices().peekable();
    let mut params = Vec::new();
    let at =
        |it: &mut std::iter::Peekable<std::str::CharIndices>| it.peek().map_or(text.len(), |c| c.0);
    let skip_ws = |it: &mut std::iter::Peekable<std::str::CharIndices>| {
        while it.next_if(|c| c.1.is_whitespace()).is_some() {}
    };
    loop {
        skip_ws(&mut it);
        let start = at(&mut it);
        while it.next_if(|c| !c.1.is_whitespace() && c.1 != '=').is_some() {}
        let key_end = at(&mut it);
        if key_end == start {
            return match it.peek() {
                None => Ok(params),
                Some(_) => Err("a value has no key"),
            };
        }
        skip_ws(&mut it);
        if it.next_if(|c| c.1 == '=').is_none() {
            return Err("a key is not followed by `=`");
        }
        skip_ws(&mut it);
        let value_start = at(&mut it);
        let quoted = it.next_if(|c| c.1 == '\'').is_some();
        let mut value = String::new();
        loop {
            match it.peek().map(|c| c.1) {
                None if quoted => return Err("a quoted value is not terminated"),
                None => break,
                Some('\'') if quoted => {
                    it.next();
                    break;
                }
                Some(c) if !quoted && c.is_whitespace() => break,
                Some('\\') => {
                    it.next();
                    if let Some((_, c)) = it.next() {
                        value.push(c);
                    }
                }
                Some(c) => {
                    it.next();
                    value.push(c);
                }
            }
        }
        let end = at(&mut it);
        if !quoted && value.is_empty() {
            return Err("a key has an empty value (quote it: key='')");
        }
        params.push(Param {
            key: text[start..key_end].to_string(),
            value,
            value_at: value_start..end,
            whole: start..end,
        });
    }
}

/// libpq's `sslmode`, all five that mean something over TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS if the server offers it, unverified; plain otherwise (libpq's default).
    Prefer,
    /// TLS or fail, unverified.
    Require,
    /// TLS or fail; the server's chain must lead to `sslrootcert`.
    VerifyCa,
    /// As VerifyCa, and the certificate must name the host connected to.
    VerifyFull,
}

/// What the link asks of TLS: the mode, and the root certificates' file (or `system`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    pub mode: SslMode,
    pub root_cert: Option<String>,
}

/// The keys handled here rather than by the driver.
pub const TLS_KEYS: [&str; 2] = ["sslmode", "sslrootcert"];

impl ConnInfo {
    /// The TLS the string asks for, as libpq reads it: `prefer` by default, and `require`
    /// with an `sslrootcert` verifies the chain like `verify-ca`.
    pub fn tls(&self) -> Result<Tls, &'static str> {
        let root_cert = self.get("sslrootcert").map(str::to_string);
        let mode = match self.get("sslmode").unwrap_or("prefer") {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" if root_cert.is_some() => SslMode::VerifyCa,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => return Err("sslmode=allow is not supported: use prefer or require"),
            _ => {
                return Err(
                    "sslmode must be one of disable, prefer, require, verify-ca, verify-full",
                )
            }
        };
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
            return Err(
                "sslmode=verify-ca and verify-full need sslrootcert=<file> (or sslrootcert=system)",
            );
        }
        Ok(Tls { mode, root_cert })
    }
}

#[cfg(test)]
#[path = "conninfo_tests.rs"]
mod tests;
