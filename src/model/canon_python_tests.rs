//! `NORMALIZE username` checked against a reference outside the crate: Python's `unicodedata`
//! (NFKC → `str.casefold` → NFKC → `str.strip`), on every code point alone and inside ASCII.

use std::process::Command;

use super::Normalize;
use crate::model::canon_username::username_by_steps;

/// Prints, for every code point Python's `unicodedata` knows as assigned (general category
/// not `Cn`, surrogates left out), its form alone and inside `Ab…Cd`: one line per code
/// point, `cp<TAB>alone<TAB>inside`, each form as hex code points joined by commas. The first
/// line is the Unicode version of Python's tables.
const PYTHON: &str = r#"
import sys, unicodedata as u
def form(s):
    return ",".join("%x" % ord(c) for c in u.normalize("NFKC", u.normalize("NFKC", s).casefold()).strip())
out = [u.unidata_version]
for cp in range(0x110000):
    c = chr(cp)
    if u.category(c) in ("Cn", "Cs"):
        continue
    out.append("%x\t%s\t%s" % (cp, form(c), form("Ab" + c + "Cd")))
sys.stdout.write("\n".join(out) + "\n")
"#;

fn decode(hex: &str) -> String {
    hex.split(',')
        .filter(|h| !h.is_empty())
        .map(|h| char::from_u32(u32::from_str_radix(h, 16).unwrap()).unwrap())
        .collect()
}

fn version(v: &str) -> (u64, u64, u64) {
    let mut p = v.split('.').map(|x| x.parse::<u64>().unwrap());
    (p.next().unwrap(), p.next().unwrap(), p.next().unwrap_or(0))
}

/// Every code point assigned in Python's Unicode version, alone and inside ASCII text, gets
/// Python's form from both the path that ships (`apply`: its ASCII fast path, or the item
/// piece by piece) and the steps on the whole item. The one difference is the trim's:
/// `str.strip` also removes U+001C..U+001F, which are not `White_Space` and which
/// `str::trim`, and so the stored forms since the first release, keep; the test pins exactly
/// that.
///
/// Python's tables may be older than the crates' (here Python 3.11: Unicode 14; case folding
/// 16, normalization 18), so only code points assigned in Python's version are compared:
/// Unicode's stability policies keep their normalization and case folding from changing in
/// later versions. A Python whose tables are newer than the crates' fails here, since code
/// points it knows and the crates do not would differ for that reason alone.
#[test]
fn username_equals_python_unicodedata_on_every_code_point() {
    let out = Command::new("python3")
        .args(["-c", PYTHON])
        .output()
        .expect("python3 (a test dependency) runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let py = version(lines.next().unwrap());
    let fold = caseless::UNICODE_VERSION;
    let (a, b, c) = unicode_normalization::UNICODE_VERSION;
    let norm = (u64::from(a), u64::from(b), u64::from(c));
    assert!(
        py <= fold && py <= norm,
        "Python's Unicode {py:?} is newer than the crates' (case folding {fold:?}, \
         normalization {norm:?}): run the test with an older Python"
    );
    let (mut compared, mut differ) = (0u32, Vec::new());
    for line in lines {
        let mut f = line.split('\t');
        let cp = u32::from_str_radix(f.next().unwrap(), 16).unwrap();
        let c = char::from_u32(cp).unwrap();
        let alone = c.to_string();
        let inside = format!("Ab{c}Cd");
        for (input, want) in [(alone, f.next().unwrap()), (inside, f.next().unwrap())] {
            let want = decode(want);
            let shipped = Normalize::Username.apply(&input);
            let general = username_by_steps(&input);
            if shipped != want || general != want {
                assert_eq!(shipped, general, "U+{cp:04X}: the two paths differ");
                differ.push(input);
            }
            compared += 1;
        }
    }
    // Every assigned code point but the surrogates, twice (Unicode 14: 282 k).
    assert!(compared > 2 * 280_000, "only {compared} inputs compared");
    let expected: Vec<String> = ('\u{1c}'..='\u{1f}').map(String::from).collect();
    assert_eq!(
        differ, expected,
        "Python's strip() removes U+001C..U+001F, str::trim does not: nothing else may differ"
    );
}
