//! The module's own load arguments (`--loadmodule libmember.so workers 8 batch-size 64`): name
//! value pairs, each name a config of the module, given once and with a value. Anything else
//! fails the load with the reason (`hooks/config_load.rs`), instead of being ignored.

/// The arguments split into pairs, checked for shape (not yet for known names).
pub struct ModuleArgs<'a> {
    pairs: Vec<(&'a str, &'a [u8])>,
}

impl<'a> ModuleArgs<'a> {
    /// Pairs `args` up. Refused: a name left without its value, a name that is not
    /// printable text (shown escaped), a name given twice.
    pub fn parse(args: &[&'a [u8]]) -> Result<ModuleArgs<'a>, String> {
        let mut pairs: Vec<(&str, &[u8])> = Vec::with_capacity(args.len() / 2);
        for pair in args.chunks(2) {
            let name = match crate::config::text::check("", pair[0]) {
                Ok(n) if !n.is_empty() => n,
                _ => {
                    return Err(format!(
                        "libmember: module argument {}: not a config name",
                        crate::server::reply::escape(pair[0])
                    ))
                }
            };
            let [_, value] = pair else {
                return Err(format!(
                    "libmember: module argument {name}: no value given (the module's \
                     arguments are name value pairs, e.g. workers 8)"
                ));
            };
            if pairs.iter().any(|(n, _)| *n == name) {
                return Err(format!("libmember: module argument {name}: given twice"));
            }
            pairs.push((name, value));
        }
        Ok(ModuleArgs { pairs })
    }

    /// The value given for `name`, if any.
    pub fn value(&self, name: &str) -> Option<&'a [u8]> {
        self.pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// Refuses a name that is not in `known` (the configs the module registered).
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        match self.pairs.iter().find(|(n, _)| !known.contains(n)) {
            None => Ok(()),
            Some((name, _)) => Err(format!(
                "libmember: unknown module argument {name} (the module's arguments are its \
                 configs without the member. prefix: {})",
                known.join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse<'a>(args: &[&'a str]) -> Result<ModuleArgs<'a>, String> {
        let raw: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        ModuleArgs::parse(&raw)
    }

    #[test]
    fn pairs_are_looked_up_by_name_only() {
        let a = parse(&["workers", "3", "token-key-file", "workers"]).unwrap();
        assert_eq!(a.value("workers"), Some(&b"3"[..]));
        assert_eq!(a.value("token-key-file"), Some(&b"workers"[..]));
        assert_eq!(a.value("batch-size"), None);
        a.only(&["workers", "token-key-file"]).unwrap();
        assert!(parse(&[]).unwrap().only(&["workers"]).is_ok());
    }

    #[test]
    fn unknown_missing_and_repeated_names_are_refused() {
        let e = parse(&["wokers", "3"])
            .unwrap()
            .only(&["workers"])
            .unwrap_err();
        assert!(
            e.starts_with("libmember: unknown module argument wokers"),
            "{e}"
        );
        assert!(e.contains("workers"), "{e}");
        let e = parse(&["workers"]).err().unwrap();
        assert!(e.contains("module argument workers: no value given"), "{e}");
        let e = parse(&["workers", "3", "batch-size"]).err().unwrap();
        assert!(
            e.contains("module argument batch-size: no value given"),
            "{e}"
        );
        let e = parse(&["workers", "3", "workers", "4"]).err().unwrap();
        assert_eq!(e, "libmember: module argument workers: given twice");
        let e = parse(&["a\0b", "1"]).err().unwrap();
        assert_eq!(e, "libmember: module argument a\\x00b: not a config name");
        assert!(parse(&["", "1"]).is_err());
    }
}
