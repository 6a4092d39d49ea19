//! TCP_NODELAY on the cluster-bus connections this node opened. Valkey 8.0 sets it only on the
//! bus connections a node accepts (`clusterAcceptHandler`), not on those it opens
//! (`clusterLinkConnectHandler`), and a node sends every message, the module's included, over
//! the connections it opened. With Nagle's algorithm on, a small message written while an
//! earlier one is unacknowledged waits for the peer's delayed ACK, 40 ms on Linux, and the
//! answer comes back over the peer's own connection, so no reply carries that ACK: concurrent
//! forwarded requests and MEXISTS/MADD parts then took 40–90 ms instead of a fraction of one
//! (docs/cluster-commands.md). The module finds those sockets in `/proc/self/fd` by their peer
//! port (another node's bus port) and sets the option the server sets on the other side.

use std::cell::RefCell;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bus sockets this node set TCP_NODELAY on (INFO `bus_nodelay_set`): one per link it opened,
/// again each time a link is opened anew.
pub static SET: AtomicU64 = AtomicU64::new(0);

/// The other nodes' bus ports and link states when the sockets were last looked at, and when.
struct Looked {
    links: Vec<(u16, bool)>,
    at: Option<Instant>,
}

thread_local! {
    static LAST: RefCell<Looked> = const {
        RefCell::new(Looked {
            links: Vec::new(),
            at: None,
        })
    };
}

/// Even with no link seen to change, the sockets are looked at again this often (a link may
/// have been closed and opened again between two polls).
const AGAIN: Duration = Duration::from_secs(10);

/// Called with every `CLUSTER NODES` poll: `links` are the other nodes' (bus port, link
/// connected). Looks at this process's sockets when a link changed, or `AGAIN` passed.
pub fn after_poll(links: Vec<(u16, bool)>) {
    let due = LAST.with(|l| {
        let l = l.borrow();
        l.links != links || l.at.is_none_or(|t| t.elapsed() >= AGAIN)
    });
    if !due {
        return;
    }
    let ports: Vec<u16> = links.iter().map(|(p, _)| *p).collect();
    let changed = set_on_peers(&ports);
    SET.fetch_add(changed as u64, Ordering::Relaxed);
    LAST.with(|l| {
        *l.borrow_mut() = Looked {
            links,
            at: Some(Instant::now()),
        }
    });
}

/// Sets TCP_NODELAY on every TCP socket of this process whose peer port is in `ports`;
/// returns how many it changed.
pub fn set_on_peers(ports: &[u16]) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut changed = 0;
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<c_int>().ok())
        else {
            continue;
        };
        if peer_port(fd).is_some_and(|p| ports.contains(&p)) && set_nodelay(fd) {
            changed += 1;
        }
    }
    changed
}

/// The peer port of `fd` when it is a connected TCP socket (IPv4 or IPv6).
fn peer_port(fd: c_int) -> Option<u16> {
    let mut kind: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: plain syscalls on a descriptor of this process, with buffers of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut kind as *mut c_int).cast::<c_void>(),
            &mut len,
        )
    };
    if rc != 0 || kind != libc::SOCK_STREAM {
        return None;
    }
    // SAFETY: zeroed sockaddr_storage is a valid value; getpeername writes at most `len` bytes.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let rc = unsafe {
        libc::getpeername(
            fd,
            (&mut addr as *mut libc::sockaddr_storage).cast::<libc::sockaddr>(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    match addr.ss_family as c_int {
        // SAFETY: the family says which layout the kernel wrote.
        libc::AF_INET => Some(u16::from_be(unsafe {
            (*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()).sin_port
        })),
        libc::AF_INET6 => Some(u16::from_be(unsafe {
            (*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()).sin6_port
        })),
        _ => None,
    }
}

/// Sets TCP_NODELAY on `fd` unless it is set; true when it was changed.
fn set_nodelay(fd: c_int) -> bool {
    let mut on: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: as in `peer_port`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&mut on as *mut c_int).cast::<c_void>(),
            &mut len,
        )
    };
    if rc != 0 || on != 0 {
        return false;
    }
    let on: c_int = 1;
    // SAFETY: as above.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&on as *const c_int).cast::<c_void>(),
            std::mem::size_of::<c_int>() as libc::socklen_t,
        ) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn only_the_sockets_to_the_given_ports_get_nodelay() {
        let bus = TcpListener::bind("127.0.0.1:0").unwrap();
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let to_bus = TcpStream::connect(bus.local_addr().unwrap()).unwrap();
        let to_other = TcpStream::connect(other.local_addr().unwrap()).unwrap();
        assert!(!to_bus.nodelay().unwrap() && !to_other.nodelay().unwrap());
        assert!(set_on_peers(&[bus.local_addr().unwrap().port()]) >= 1);
        assert!(to_bus.nodelay().unwrap());
        assert!(!to_other.nodelay().unwrap());
        // Looked at again: nothing left to change on that socket.
        assert!(!set_nodelay(to_bus.as_raw_fd()));
    }
}
