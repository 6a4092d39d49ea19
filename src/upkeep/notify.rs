//! Change notification (`member.sync-notify`, docs/sync.md): one thread holds one connection
//! that LISTENs for outside writes and wakes the sync loop, once it has heard a notification
//! sent from another connection (docs/pooler.md); the loop's pass itself is unchanged.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;

use crate::db::sql;
use crate::{config, server::mainq, server::reply};

/// What the listener is doing, as `INFO member` shows it (`sync_notify`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Off = 0,
    Connecting = 1,
    Listening = 2,
    Reconnecting = 3,
    /// The listener's LISTEN did not hear a notification sent from another connection (a
    /// transaction pooler between them): outside writes arrive with the sync interval.
    Unheard = 4,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Off => "off",
            State::Connecting => "connecting",
            State::Listening => "listening",
            State::Reconnecting => "reconnecting",
            State::Unheard => "unheard",
        }
    }
}

static STATE: AtomicU8 = AtomicU8::new(State::Off as u8);
/// Notifications received, and connections that reached LISTEN, since the server started.
pub static RECEIVED: AtomicU64 = AtomicU64::new(0);
pub static CONNECTS: AtomicU64 = AtomicU64::new(0);
/// Why the listener last failed (connection, LISTEN, a table left without the trigger).
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);
/// Raised by the listener, taken by the main thread's tick (`sync::poke`).
static WAKE: AtomicBool = AtomicBool::new(false);
/// A listener thread exists.
static RUNNING: AtomicBool = AtomicBool::new(false);
/// The module has finished loading: threads may start.
static LOADED: AtomicBool = AtomicBool::new(false);

/// How long one wait for a notification lasts before the config is looked at again.
const POLL: Duration = Duration::from_millis(250);
/// A quiet connection is checked this often (a cut network closes nothing by itself).
const CHECK_EVERY: Duration = Duration::from_secs(5);
/// Reconnection backoff: doubles from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long a listener that did not hear its check waits before it tries again.
const UNHEARD_RETRY: Duration = Duration::from_secs(60);
/// The listener's check: one notification from another connection, heard within
/// `max(HEAR_WITHIN, member.db-timeout-ms)`.
const HEAR_WITHIN: Duration = Duration::from_secs(2);
/// Set while the listener is unheard and has said so (logged once until it hears again).
static UNHEARD_SAID: AtomicBool = AtomicBool::new(false);
/// Why a listener is unheard, as `sync_notify_error` says it.
const UNHEARD: &str = "a notification sent through member.pg-url from another connection \
     never reached the listener (a pooler in transaction pooling between them?): outside \
     writes arrive within member.sync-interval-ms; the listener tries again every minute";

pub fn state() -> State {
    match STATE.load(Ordering::Acquire) {
        1 => State::Connecting,
        2 => State::Listening,
        3 => State::Reconnecting,
        4 => State::Unheard,
        _ => State::Off,
    }
}

fn set_state(s: State) {
    STATE.store(s as u8, Ordering::Release);
}

/// The listener's last failure, if any since it last connected.
pub fn last_error() -> Option<String> {
    LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

fn set_error(e: Option<String>) {
    *LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = e;
}

/// True once per wake-up raised since the last call (main thread).
pub fn take_wake() -> bool {
    WAKE.swap(false, Ordering::AcqRel)
}

fn wake() {
    WAKE.store(true, Ordering::Release);
}

/// Called at the end of module load: starts the listener if the config asks for it.
pub fn started() {
    LOADED.store(true, Ordering::Release);
    ensure();
}

/// Starts the listener thread when `member.sync-notify` is on and none runs (a thread that
/// finds the config off ends by itself).
pub fn ensure() {
    if !LOADED.load(Ordering::Acquire) || !config::sync_notify() {
        return;
    }
    if RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("member-notify".into())
        .spawn(listener);
    if spawned.is_err() {
        RUNNING.store(false, Ordering::Release);
    }
}

/// Logs from any thread, through the main-thread queue.
fn log(level: reply::Level, msg: String) {
    mainq::post(Box::new(move |ctx| reply::log(ctx, level, &msg)));
}

fn listener() {
    let mut backoff = BACKOFF_FIRST;
    let mut ever = false;
    let mut said: Option<String> = None;
    loop {
        if !config::sync_notify() {
            set_state(State::Off);
            set_error(None);
            RUNNING.store(false, Ordering::Release);
            // A CONFIG SET yes that came while this thread was leaving found it running.
            if config::sync_notify() && !RUNNING.swap(true, Ordering::AcqRel) {
                continue;
            }
            return;
        }
        set_state(if ever {
            State::Reconnecting
        } else {
            State::Connecting
        });
        match session(&mut ever, &mut backoff) {
            Ok(()) => said = None,
            Err(e) => {
                if said.as_deref() != Some(e.as_str()) {
                    log(
                        reply::Level::Warning,
                        format!(
                            "libmember: sync-notify listener: {e} (reconnecting; the sync \
                             loop keeps its interval meanwhile)"
                        ),
                    );
                    said = Some(e.clone());
                }
                set_error(Some(e));
                set_state(State::Reconnecting);
                pause(backoff);
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Sleeps `d`, in short steps that end early when the config is turned off.
fn pause(d: Duration) {
    let until = Instant::now() + d;
    while config::sync_notify() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(POLL));
    }
}

/// Opens the listener's own connection (or, `app` "libmember-probe", the one its check
/// notifies from) through the module's link (password source, TLS, a pooler detected).
fn connect(app: &str) -> Result<(Client, u64), String> {
    let (link_settings, generation) = config::pg_link();
    let timeout = config::db_timeout_ms();
    let (client, _) = crate::db::open_link(
        &link_settings,
        (timeout.saturating_mul(4).max(1000), timeout),
        false,
        app,
    )
    .map_err(|e| match e {
        crate::db::DbErr::Unavailable(m) | crate::db::DbErr::Failed(m) => m,
        other => other.reply_text(),
    })?;
    Ok((client, generation))
}

fn db_text(e: &postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_string())
}

/// One connection's life: install, LISTEN, then wait for notifications until the connection
/// fails (Err) or the config says stop or reconnect (Ok).
fn session(ever: &mut bool, backoff: &mut Duration) -> Result<(), String> {
    let (mut client, generation) = connect("libmember-listen")?;
    // LISTEN first: a write that commits while the triggers are being installed wakes us.
    client
        .batch_execute(&format!("LISTEN {}", sql::NOTIFY_CHANNEL))
        .map_err(|e| format!("LISTEN failed: {}", db_text(&e)))?;
    // Failing to install (no CREATE on the schema, say) is not fatal: triggers another node
    // installed still notify, and the interval covers the rest.
    let failed = match sql::install_notify(&mut client) {
        Ok(failed) => failed,
        Err(e) if client.is_closed() => {
            return Err(format!("installing the notify trigger: {}", db_text(&e)))
        }
        Err(e) => vec![("the set tables".to_string(), db_text(&e))],
    };
    set_error(None);
    for (table, why) in &failed {
        let msg = format!(
            "cannot install the notify trigger on {table} ({why}): its outside writes arrive \
             within member.sync-interval-ms instead"
        );
        log(reply::Level::Warning, format!("libmember: {msg}"));
        set_error(Some(msg));
    }
    // Heard, or the interval alone serves (and this connection's LISTEN is dropped, which
    // through a transaction pooler may reach another server connection: the one that holds
    // it is closed by the pooler at the first notification it gets while idle). Two checks
    // in a row must be heard: through a transaction pooler, one may be by chance, when the
    // server connection holding the LISTEN is lent to this client just as it arrives.
    if !(hears(&mut client)? && hears(&mut client)?) {
        let _ = client.batch_execute("UNLISTEN *");
        drop(client);
        if !UNHEARD_SAID.swap(true, Ordering::AcqRel) {
            log(
                reply::Level::Warning,
                format!("libmember: sync-notify: {UNHEARD}"),
            );
        }
        set_error(Some(UNHEARD.to_string()));
        set_state(State::Unheard);
        // Sooner when `member.pg-url` (or `member.pg-pooler`) changes.
        let until = Instant::now() + UNHEARD_RETRY;
        while config::sync_notify() && config::pg_link_gen() == generation && Instant::now() < until
        {
            std::thread::sleep(POLL);
        }
        return Ok(());
    }
    if UNHEARD_SAID.swap(false, Ordering::AcqRel) {
        log(
            reply::Level::Notice,
            "libmember: sync-notify listener hears notifications again".into(),
        );
    }
    // Counted first: whoever sees `listening` also sees this connection counted.
    CONNECTS.fetch_add(1, Ordering::Relaxed);
    set_state(State::Listening);
    *backoff = BACKOFF_FIRST;
    if *ever {
        log(
            reply::Level::Notice,
            "libmember: sync-notify listener connected again".into(),
        );
    }
    *ever = true;
    // Whatever was committed while no one listened: one pass now.
    wake();
    let timeout = Duration::from_millis(config::db_timeout_ms());
    let mut checked = Instant::now();
    loop {
        if !config::sync_notify() || config::pg_link_gen() != generation {
            return Ok(());
        }
        let got = receive(&mut client)?;
        if got > 0 {
            RECEIVED.fetch_add(got, Ordering::Relaxed);
            wake();
        }
        if client.is_closed() {
            return Err("the listener's connection was closed".into());
        }
        if checked.elapsed() >= CHECK_EVERY {
            checked = Instant::now();
            client
                .is_valid(timeout)
                .map_err(|e| format!("the listener's connection is gone: {}", db_text(&e)))?;
        }
    }
}

/// Whether `client`, LISTENing, hears a notification sent from a connection of its own: a
/// notification that is not the check's (an outside write) counts and wakes as usual.
fn hears(client: &mut Client) -> Result<bool, String> {
    static CHECKS: AtomicU64 = AtomicU64::new(0);
    let token = format!(
        "libmember-check-{}-{}",
        std::process::id(),
        CHECKS.fetch_add(1, Ordering::Relaxed)
    );
    {
        let (mut probe, _) = connect("libmember-probe")?;
        probe
            .batch_execute(&format!(
                "SELECT pg_catalog.pg_notify('{}', '{token}')",
                sql::NOTIFY_CHANNEL
            ))
            .map_err(|e| format!("the listener's check could not notify: {}", db_text(&e)))?;
    }
    let lost = |e: postgres::Error| format!("the listener's connection failed: {}", db_text(&e));
    let until = Instant::now() + HEAR_WITHIN.max(Duration::from_millis(config::db_timeout_ms()));
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let got = {
            let mut n = client.notifications();
            let next = n.timeout_iter(left.min(POLL)).next().map_err(lost)?;
            next.map(|g| g.payload() == token)
        };
        match got {
            Some(true) => return Ok(true),
            Some(false) => {
                RECEIVED.fetch_add(1, Ordering::Relaxed);
                wake();
            }
            None if client.is_closed() => return Err("the listener's connection was closed".into()),
            None => {}
        }
    }
}

/// Waits up to `POLL` for a notification; returns how many arrived (all buffered ones).
fn receive(client: &mut Client) -> Result<u64, String> {
    let lost = |e: postgres::Error| format!("the listener's connection failed: {}", db_text(&e));
    let mut n = client.notifications();
    let first = n.timeout_iter(POLL).next().map_err(lost)?;
    if first.is_none() {
        return Ok(0);
    }
    let mut got = 1;
    let mut rest = n.iter();
    while rest.next().map_err(lost)?.is_some() {
        got += 1;
    }
    Ok(got)
}
