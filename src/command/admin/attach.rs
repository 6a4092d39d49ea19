//! The options of MEMBER.CREATE that attach a set to a table the module does not own
//! (docs/attach.md): `SOURCE <schema>.<table> COLUMN <col> [SCOPE-COLUMN <col>]
//! [UPDATED-COLUMN <col> | SYNC log]`, parsed and checked as far as the arguments alone allow.
//! The table itself is checked against the database's catalog by `db::source_check`; the
//! operator's allow list (`member.attach-allow`) by `allowed`.

use redis_module::{RedisError, RedisString};

use crate::model::canon::Normalize;
use crate::model::error;
use crate::model::token::Tokenize;
use crate::sets::state::{Source, SourceSync};

/// The attach options, in the order they are looked for.
const NAMES: [&str; 5] = ["SOURCE", "COLUMN", "SCOPE-COLUMN", "UPDATED-COLUMN", "SYNC"];

/// Takes the attach options out of CREATE's option pairs: the remaining pairs, and the source
/// if SOURCE was given. Arguments are name/value pairs (CREATE checked the count).
pub fn split(pairs: Vec<RedisString>) -> Result<(Vec<RedisString>, Option<Source>), RedisError> {
    let mut rest = Vec::with_capacity(pairs.len());
    let mut found: [Option<RedisString>; 5] = Default::default();
    let mut it = pairs.into_iter();
    while let (Some(name), Some(value)) = (it.next(), it.next()) {
        match NAMES
            .iter()
            .position(|n| n.as_bytes().eq_ignore_ascii_case(name.as_slice()))
        {
            Some(i) if found[i].is_some() => return Err(RedisError::Str(error::DUPLICATE_OPTION)),
            Some(i) => found[i] = Some(value),
            None => rest.extend([name, value]),
        }
    }
    let [source, column, scope, updated, sync] = found;
    let Some(source) = source else {
        if column.is_some() || scope.is_some() || updated.is_some() || sync.is_some() {
            return Err(RedisError::Str(error::SOURCE_OPTION_ALONE));
        }
        return Ok((rest, None));
    };
    let (schema, table) = std::str::from_utf8(source.as_slice())
        .ok()
        .and_then(|s| s.split_once('.'))
        .filter(|(a, b)| ident_ok(a) && ident_ok(b))
        .ok_or(RedisError::Str(error::SOURCE_NAME))?;
    let ident = |v: &RedisString| {
        std::str::from_utf8(v.as_slice())
            .ok()
            .filter(|s| ident_ok(s))
            .map(str::to_string)
            .ok_or(RedisError::Str(error::SOURCE_BAD_IDENT))
    };
    let column = ident(
        column
            .as_ref()
            .ok_or(RedisError::Str(error::SOURCE_NEEDS_COLUMN))?,
    )?;
    let scope_column = scope.as_ref().map(ident).transpose()?;
    let sync = match (updated, sync) {
        (Some(_), Some(_)) => return Err(RedisError::Str(error::SOURCE_SYNC_BOTH)),
        (None, None) => return Err(RedisError::Str(error::SOURCE_NEEDS_SYNC)),
        (Some(u), None) => SourceSync::Updated(ident(&u)?),
        (None, Some(s)) if s.as_slice().eq_ignore_ascii_case(b"log") => SourceSync::Log,
        (None, Some(_)) => return Err(RedisError::Str(error::SOURCE_BAD_SYNC)),
    };
    Ok((
        rest,
        Some(Source {
            schema: schema.to_string(),
            table: table.to_string(),
            column,
            scope_column,
            sync,
        }),
    ))
}

/// What an attached set cannot combine with: NORMALIZE username, TOKENIZE.
pub fn check(normalize: Normalize, tokenize: &Tokenize) -> Result<(), RedisError> {
    if normalize == Normalize::Username {
        return Err(RedisError::Str(error::SOURCE_USERNAME));
    }
    if tokenize.is_on() {
        return Err(RedisError::Str(error::SOURCE_TOKENIZE));
    }
    Ok(())
}

/// The operator's `member.attach-allow` must list the source (checked at every CREATE that
/// gives SOURCE, before the database is asked: a refusal changes nothing).
pub fn allowed(src: &Source) -> Result<(), RedisError> {
    if crate::config::attach_allow::allowed(&src.schema, &src.table) {
        Ok(())
    } else {
        Err(RedisError::Str(error::SOURCE_NOT_ALLOWED))
    }
}

/// A PostgreSQL name as the catalog holds it: 1 to 63 bytes (NAMEDATALEN - 1), no NUL.
fn ident_ok(s: &str) -> bool {
    (1..=63).contains(&s.len()) && !s.contains('\0')
}
