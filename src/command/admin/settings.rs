//! The set settings MEMBER.CREATE and MEMBER.ALTER take (`ERROR`, `CAPACITY`, `CACHE-TTL`,
//! `RECENT-TTL`, `NORMALIZE`, `TOKENIZE`), parsed and range-checked in this one place.

use redis_module::{RedisError, RedisString};

use crate::command::Options;
use crate::model::canon::Normalize;
use crate::model::token::Tokenize;
use crate::sets::state::SetChange;
use crate::{config, config::token_key, model::error};

/// Every settings option, in the order of `SetDef::conflicts_with`'s `explicit` flags.
pub const NAMES: [&str; 6] = [
    "ERROR",
    "CAPACITY",
    "CACHE-TTL",
    "RECENT-TTL",
    "NORMALIZE",
    "TOKENIZE",
];

/// The settings a call gave, each checked against its range; `None` when not given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Given {
    /// The four settings that ALTER may change too.
    pub change: SetChange,
    pub normalize: Option<Normalize>,
    pub tokenize: Option<Tokenize>,
}

impl Given {
    /// Parses the settings options (names in `NAMES`, case-insensitive, each at most once).
    pub fn parse(rest: impl Iterator<Item = RedisString>) -> Result<Given, RedisError> {
        let o = Options::parse(rest, NAMES[0], &NAMES[1..])?;
        let error_rate = match o.get("ERROR") {
            Some(v) => Some(
                std::str::from_utf8(v.as_slice())
                    .ok()
                    .and_then(config::parse_error_rate)
                    .ok_or(RedisError::Str(error::BAD_ERROR_RATE))?,
            ),
            None => None,
        };
        let int = |name, range, bad| o.int(name, range, bad).map(|v| v.map(|v| v as u64));
        let capacity = int(
            "CAPACITY",
            1..=config::DEFAULT_CAPACITY_MAX,
            error::BAD_CAPACITY,
        )?;
        let cache_ttl = int(
            "CACHE-TTL",
            config::CACHE_TTL_MIN..=config::CACHE_TTL_MAX,
            error::BAD_CACHE_TTL,
        )?;
        let recent_ttl = int(
            "RECENT-TTL",
            config::RECENT_TTL_MIN..=config::RECENT_TTL_MAX,
            error::BAD_RECENT_TTL,
        )?;
        let normalize = match o.get("NORMALIZE") {
            Some(v) => {
                Some(Normalize::parse(v.as_slice()).ok_or(RedisError::Str(error::BAD_NORMALIZE))?)
            }
            None => None,
        };
        let tokenize = match o.get("TOKENIZE") {
            Some(v) => Some(tokenize(v)?),
            None => None,
        };
        Ok(Given {
            change: SetChange {
                error_rate,
                capacity,
                cache_ttl,
                recent_ttl,
            },
            normalize,
            tokenize,
        })
    }

    /// Which settings were given, in the order of `NAMES`.
    pub fn explicit(&self) -> [bool; 6] {
        let c = &self.change;
        [
            c.error_rate.is_some(),
            c.capacity.is_some(),
            c.cache_ttl.is_some(),
            c.recent_ttl.is_some(),
            self.normalize.is_some(),
            self.tokenize.is_some(),
        ]
    }
}

/// `TOKENIZE none|hmac-sha256`: a tokenized set records the loaded key's fingerprint.
fn tokenize(v: &RedisString) -> Result<Tokenize, RedisError> {
    match v.as_slice().to_ascii_lowercase().as_slice() {
        b"none" => Ok(Tokenize::None),
        b"hmac-sha256" => {
            let fingerprint =
                token_key::fingerprint().ok_or(RedisError::Str(error::TOKENIZE_NEEDS_KEY))?;
            Ok(Tokenize::HmacSha256 { fingerprint })
        }
        _ => Err(RedisError::Str(error::BAD_TOKENIZE)),
    }
}
