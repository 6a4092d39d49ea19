//! A small fault-injecting TCP proxy for the link between the module and PostgreSQL: accepts on
//! a local port, connects upstream, pumps both ways, and can delay, stall, cut or refuse.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// What the proxy does with traffic right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Hold every chunk, either way, this many milliseconds before forwarding it.
    Delay(u64),
    /// Accept new connections and close them at once (the database "refuses").
    Refuse,
    /// Connections open when the stall began forward nothing until it ends (a half-dead
    /// link); new connections pass.
    StallExisting,
}

struct Shared {
    mode: Mutex<Mode>,
    /// The port of 127.0.0.1 new connections go to.
    upstream: AtomicU16,
    /// Connections opened before this id are stalled while the mode is `StallExisting`.
    stall_before: AtomicU64,
    next_id: AtomicU64,
    conns: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    stop: AtomicBool,
}

/// The proxy: a listener thread plus two pump threads per connection. Stops on drop.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            upstream: AtomicU16::new(upstream),
            stall_before: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            conns: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let sh = shared.clone();
        thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept_loop(listener, sh))
            .expect("spawn proxy thread");
        Proxy { port, shared }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sets the mode; `StallExisting` stalls the connections open at this moment.
    pub fn set(&self, mode: Mode) {
        if mode == Mode::StallExisting {
            let next = self.shared.next_id.load(Ordering::SeqCst);
            self.shared.stall_before.store(next, Ordering::SeqCst);
        }
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// New connections go to `127.0.0.1:port` from now on (a failover of PostgreSQL).
    pub fn retarget(&self, port: u16) {
        self.shared.upstream.store(port, Ordering::SeqCst);
    }

    /// Closes every connection open now, both sides; returns how many.
    pub fn cut(&self) -> usize {
        let conns = std::mem::take(&mut *self.shared.conns.lock().unwrap());
        for (_, a, b) in &conns {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        conns.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port)); // wake the accept loop
        self.cut();
    }
}

fn accept_loop(listener: TcpListener, sh: Arc<Shared>) {
    for conn in listener.incoming() {
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(down) = conn else { continue };
        if *sh.mode.lock().unwrap() == Mode::Refuse {
            let _ = down.shutdown(Shutdown::Both);
            continue;
        }
        let up = SocketAddr::from(([127, 0, 0, 1], sh.upstream.load(Ordering::SeqCst)));
        let Ok(upstream) = TcpStream::connect_timeout(&up, Duration::from_secs(2)) else {
            let _ = down.shutdown(Shutdown::Both);
            continue;
        };
        let _ = down.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let id = sh.next_id.fetch_add(1, Ordering::SeqCst);
        let (Ok(d2), Ok(u2), Ok(d3), Ok(u3)) = (
            down.try_clone(),
            upstream.try_clone(),
            down.try_clone(),
            upstream.try_clone(),
        ) else {
            continue;
        };
        sh.conns.lock().unwrap().push((id, d3, u3));
        let (s1, s2) = (sh.clone(), sh.clone());
        let _ = thread::Builder::new()
            .name("proxy-up".into())
            .spawn(move || pump(id, down, upstream, s1));
        let _ = thread::Builder::new()
            .name("proxy-down".into())
            .spawn(move || pump(id, u2, d2, s2));
    }
}

/// Copies `from` to `to` under the current mode until either side closes, then closes both.
fn pump(id: u64, mut from: TcpStream, mut to: TcpStream, sh: Arc<Shared>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        loop {
            let mode = *sh.mode.lock().unwrap();
            match mode {
                Mode::Delay(ms) => {
                    thread::sleep(Duration::from_millis(ms));
                    break;
                }
                Mode::StallExisting if id < sh.stall_before.load(Ordering::SeqCst) => {
                    if sh.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    thread::sleep(Duration::from_millis(10));
                }
                _ => break,
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    sh.conns.lock().unwrap().retain(|(i, _, _)| *i != id);
}
