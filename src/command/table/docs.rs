//! What COMMAND DOCS shows of a command (and so what `valkey-cli` hints): its summary,
//! complexity and arguments, as rows of the command table (`mod.rs`) carry them. The types
//! here are plain data; `declare.rs` hands them to the server, and `syntax` writes them the
//! way docs/commands.md does, so a test holds the two together.

/// A command's documentation. `since` is the module's version, the same for every command.
#[derive(Clone, Copy, Debug)]
pub struct Docs {
    /// One line: what the command does.
    pub summary: &'static str,
    /// Its cost, where one can be stated.
    pub complexity: Option<&'static str>,
    /// Its arguments after the command's name, in the order they are written.
    pub args: &'static [Arg],
}

/// The version every command has existed since, as COMMAND DOCS reports it.
pub const SINCE: &str = env!("CARGO_PKG_VERSION");

/// What an argument is, in the module API's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    String,
    Integer,
    Double,
    UnixTime,
    /// The token alone (`SYNC`, `DELETE-DATA`).
    PureToken,
    /// Exactly one of these.
    OneOf(&'static [Arg]),
    /// All of these, in order.
    Block(&'static [Arg]),
}

/// One argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arg {
    /// Unique among its siblings; COMMAND DOCS's `name`.
    pub name: &'static str,
    pub kind: Kind,
    /// The keyword written before the value (or alone, for a pure token).
    pub token: Option<&'static str>,
    /// The placeholder shown for the value, when it is not the name (`rate` for ERROR).
    pub display: Option<&'static str>,
    pub optional: bool,
    /// The value may be repeated (after the token, once).
    pub multiple: bool,
}

impl Arg {
    const fn new(name: &'static str, kind: Kind) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            display: None,
            optional: false,
            multiple: false,
        }
    }
    pub const fn string(name: &'static str) -> Arg {
        Arg::new(name, Kind::String)
    }
    pub const fn integer(name: &'static str) -> Arg {
        Arg::new(name, Kind::Integer)
    }
    pub const fn double(name: &'static str) -> Arg {
        Arg::new(name, Kind::Double)
    }
    pub const fn unix_time(name: &'static str) -> Arg {
        Arg::new(name, Kind::UnixTime)
    }
    /// A keyword alone; its name is the keyword in lower case.
    pub const fn pure(name: &'static str, token: &'static str) -> Arg {
        Arg::new(name, Kind::PureToken).token(token)
    }
    pub const fn one_of(name: &'static str, of: &'static [Arg]) -> Arg {
        Arg::new(name, Kind::OneOf(of))
    }
    pub const fn block(name: &'static str, of: &'static [Arg]) -> Arg {
        Arg::new(name, Kind::Block(of))
    }
    pub const fn token(mut self, token: &'static str) -> Arg {
        self.token = Some(token);
        self
    }
    pub const fn shown(mut self, display: &'static str) -> Arg {
        self.display = Some(display);
        self
    }
    pub const fn optional(mut self) -> Arg {
        self.optional = true;
        self
    }
    pub const fn multiple(mut self) -> Arg {
        self.multiple = true;
        self
    }

    /// The arguments inside a one-of or a block.
    pub fn inner(&self) -> Option<&'static [Arg]> {
        match self.kind {
            Kind::OneOf(of) | Kind::Block(of) => Some(of),
            _ => None,
        }
    }
}

/// The command's call as docs/commands.md writes it: `MEMBER.ADD <set> <item> [SCOPE <scope>]
/// [TTL <s> | EXPIREAT <unix-s>]`; a repeated value as `<item> [<item> …]`, the alternatives
/// of pure tokens as `none|lower`, a required choice in parentheses.
pub fn syntax(name: &str, args: &[Arg]) -> String {
    let mut out = name.to_ascii_uppercase();
    for a in args {
        out.push(' ');
        out.push_str(&written(a));
    }
    out
}

fn written(a: &Arg) -> String {
    let value = match a.kind {
        Kind::PureToken => String::new(),
        Kind::OneOf(of) => {
            let pure = of.iter().all(|o| o.kind == Kind::PureToken);
            let alts: Vec<String> = of.iter().map(written).collect();
            let alts = alts.join(if pure { "|" } else { " | " });
            if a.optional || a.token.is_some() || of.len() == 1 {
                alts
            } else {
                format!("({alts})")
            }
        }
        Kind::Block(of) => of.iter().map(written).collect::<Vec<_>>().join(" "),
        _ => format!("<{}>", a.display.unwrap_or(a.name)),
    };
    let value = if a.multiple {
        format!("{value} [{value} …]")
    } else {
        value
    };
    let mut s = match (a.token, value.is_empty()) {
        (Some(t), true) => t.to_string(),
        (Some(t), false) => format!("{t} {value}"),
        (None, _) => value,
    };
    if a.optional {
        s = format!("[{s}]");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_is_written_as_the_docs_write_it() {
        const ARGS: &[Arg] = &[
            Arg::string("set"),
            Arg::string("scope").token("SCOPE").optional(),
            Arg::one_of(
                "expiry",
                &[
                    Arg::integer("ttl").token("TTL").shown("s"),
                    Arg::unix_time("expireat").token("EXPIREAT").shown("unix-s"),
                ],
            )
            .optional(),
            Arg::one_of(
                "normalize",
                &[Arg::pure("none", "none"), Arg::pure("lower", "lower")],
            )
            .token("NORMALIZE")
            .optional(),
            Arg::one_of(
                "mode",
                &[
                    Arg::one_of("sync", &[Arg::pure("log", "log")]).token("SYNC"),
                    Arg::string("updated").token("UPDATED-COLUMN").shown("col"),
                ],
            ),
            Arg::pure("sync", "SYNC").optional(),
            Arg::string("item").token("ITEMS").multiple(),
        ];
        assert_eq!(
            syntax("member.x", ARGS),
            "MEMBER.X <set> [SCOPE <scope>] [TTL <s> | EXPIREAT <unix-s>] \
             [NORMALIZE none|lower] (SYNC log | UPDATED-COLUMN <col>) [SYNC] \
             ITEMS <item> [<item> …]"
        );
    }
}
