//! What a string config (and a module argument) may hold: UTF-8 text without control
//! characters, at most `MAX_TEXT` bytes. Checked before a value is stored anywhere, so no
//! path from a config to a reply, a log line or a C string meets a NUL byte; a refused value
//! is answered in printable text (`refusal`).

use redis_module::RedisError;

/// Longest value a string config takes (a path or a connection string), in bytes.
pub const MAX_TEXT: usize = 4096;

/// Why a value is refused: not UTF-8.
pub const NOT_TEXT: &str = "the value is not UTF-8 text";
/// Why a value is refused: a control character.
pub const CONTROL: &str =
    "the value holds a control character (NUL, tab, line break, escape, ...): refused";
/// Why a value is refused: too long.
pub const TOO_LONG: &str = "the value is longer than 4096 bytes";

/// Whether `s` holds a control character (C0, DEL or C1: what `char::is_control` says).
pub fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// Why `bytes` is not a value a string config may take, or None. Never quotes the value.
pub fn problem(bytes: &[u8]) -> Option<&'static str> {
    if bytes.len() > MAX_TEXT {
        return Some(TOO_LONG);
    }
    match std::str::from_utf8(bytes) {
        Err(_) => Some(NOT_TEXT),
        Ok(s) if has_control(s) => Some(CONTROL),
        Ok(_) => None,
    }
}

/// `bytes` as the text of the config `name`, or the error CONFIG SET answers (`name: why`,
/// the value never quoted).
pub fn check<'a>(name: &str, bytes: &'a [u8]) -> Result<&'a str, String> {
    match problem(bytes) {
        Some(why) => Err(format!("{name}: {why}")),
        // problem() has just checked it is UTF-8.
        None => std::str::from_utf8(bytes).map_err(|_| format!("{name}: {NOT_TEXT}")),
    }
}

/// A setter's refusal as the server will quote it: printable ASCII only (the framework turns
/// it into a C string, where a NUL byte would abort the server).
pub fn refusal(msg: String) -> RedisError {
    RedisError::String(crate::server::reply::printable(&msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_passes() {
        for ok in [
            "",
            "/etc/member/key",
            "host=h user=u password='a b'",
            "postgres://u:p%40@h/db?sslmode=require",
            "/tmp/été/ключ",
        ] {
            assert_eq!(problem(ok.as_bytes()), None, "{ok:?}");
            assert_eq!(check("member.x", ok.as_bytes()), Ok(ok));
        }
    }

    #[test]
    fn control_characters_are_refused_wherever_they_sit() {
        for bad in [
            "a\0b",
            "\0",
            "host='127.0.0.1\0'",
            "a\tb",
            "line\n",
            "\r",
            "\x1b[31m",
            "del\x7f",
            "c1\u{85}",
        ] {
            assert_eq!(problem(bad.as_bytes()), Some(CONTROL), "{bad:?}");
            let e = check("member.pg-url", bad.as_bytes()).unwrap_err();
            assert_eq!(e, format!("member.pg-url: {CONTROL}"));
        }
    }

    #[test]
    fn non_utf8_and_long_values_are_refused() {
        assert_eq!(problem(b"a\xffb"), Some(NOT_TEXT));
        assert_eq!(problem(&[b'a'; MAX_TEXT]), None);
        assert_eq!(problem(&[b'a'; MAX_TEXT + 1]), Some(TOO_LONG));
        // Length is checked first: a huge value is not scanned.
        assert_eq!(problem(&vec![0u8; 1 << 20]), Some(TOO_LONG));
    }
}
