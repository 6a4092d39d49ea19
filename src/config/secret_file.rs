//! Reading the small files configs name (the tokenization key, the database password): a
//! regular file only, opened without blocking and read up to a fixed bound, so a FIFO, a
//! device (`/dev/zero`), a directory or a huge file is an error, never a hang or a huge
//! allocation.

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

/// What kind of file `m` is, when it is not a regular file.
fn not_regular(m: &Metadata) -> Option<&'static str> {
    let t = m.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    }
}

/// Refuses anything but a regular file of at most `max` bytes.
fn check(m: &Metadata, max: usize) -> Result<(), String> {
    if let Some(kind) = not_regular(m) {
        return Err(format!("it is {kind}: only a regular file is read"));
    }
    if m.len() > max as u64 {
        return Err(format!("the file is larger than {max} bytes"));
    }
    Ok(())
}

/// The content of the regular file at `path`, at most `max` bytes. The path is checked
/// before it is opened (so a FIFO or a device is never opened), opened with `O_NONBLOCK` and
/// `O_NOCTTY` (a FIFO swapped in meanwhile does not block), checked again on the open file,
/// and read up to `max + 1` bytes (a file that grew meanwhile is refused, not read on).
/// Errors are short reasons without the path and never quote the content.
pub fn read(path: &str, max: usize) -> Result<Vec<u8>, String> {
    let m = std::fs::metadata(path).map_err(|e| format!("cannot open: {e}"))?;
    check(&m, max)?;
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot open: {e}"))?;
    let m = f.metadata().map_err(|e| format!("cannot open: {e}"))?;
    check(&m, max)?;
    let mut out = Vec::with_capacity(m.len() as usize + 1);
    f.take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot read: {e}"))?;
    if out.len() > max {
        out.fill(0);
        return Err(format!("the file is larger than {max} bytes"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("member-sf-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_small_regular_file_is_read() {
        let d = dir("small");
        let f = d.join("f");
        std::fs::write(&f, "abc\n").unwrap();
        assert_eq!(read(f.to_str().unwrap(), 4).unwrap(), b"abc\n");
        let e = read(f.to_str().unwrap(), 3).unwrap_err();
        assert_eq!(e, "the file is larger than 3 bytes");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn special_files_are_refused_without_blocking() {
        let d = dir("special");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Nobody opens the FIFO for writing: a blocking open would never return.
        let e = read(fifo.to_str().unwrap(), 4096).unwrap_err();
        assert!(e.contains("a FIFO"), "{e}");
        let e = read(d.to_str().unwrap(), 4096).unwrap_err();
        assert!(e.contains("a directory"), "{e}");
        let e = read("/dev/zero", 4096).unwrap_err();
        assert!(e.contains("a device"), "{e}");
        let e = read(d.join("missing").to_str().unwrap(), 4096).unwrap_err();
        assert!(e.starts_with("cannot open:"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_huge_sparse_file_is_refused_unread() {
        let d = dir("sparse");
        let f = d.join("big");
        let file = File::create(&f).unwrap();
        file.set_len(1 << 40).unwrap();
        let e = read(f.to_str().unwrap(), 4096).unwrap_err();
        assert_eq!(e, "the file is larger than 4096 bytes");
        let _ = std::fs::remove_dir_all(&d);
    }
}
