//! Opening one connection of the secured link: the password from its source, TLS as `sslmode`
//! asks (OpenSSL through postgres-openssl), and failures told without the password.

use std::error::Error as _;
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use postgres::Client;
use postgres_openssl::MakeTlsConnector;
use tokio_postgres::config::SslMode as DriverSslMode;
use tokio_postgres::{Config, NoTls};

use super::DbErr;
use crate::config::conninfo::{ConnInfo, SslMode, Tls, TLS_KEYS};
use crate::config::pg_link::{scrub, Link};

/// Largest `sslrootcert` file read, in bytes (a bundle of a few hundred certificates).
const MAX_ROOT_CERT_FILE: usize = 1 << 20;

/// Why the last connection attempt failed (None once one succeeded): INFO's `db_link_error`.
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);
/// The same for the rebuild source `member.pg-rebuild-url`: INFO's `rebuild_link_error`.
static LAST_REBUILD_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// The last connection failure's text, if the last attempt failed.
pub fn last_error() -> Option<String> {
    LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The last failure to reach `member.pg-rebuild-url` (connection, or not a standby), if the
/// last rebuild that tried it failed so.
pub fn last_rebuild_error() -> Option<String> {
    LAST_REBUILD_ERROR
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Records (or clears, with None) why the rebuild source could not be used.
pub fn set_rebuild_error(e: Option<String>) {
    *LAST_REBUILD_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = e;
}

/// Records why a connection that opened cannot be used (a pooler in statement pooling mode).
pub fn refused(link: &Link, why: &str) {
    *error_slot(link).lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_string());
}

fn error_slot(link: &Link) -> &'static Mutex<Option<String>> {
    if link.name == crate::config::pg_link::NAMES[1] {
        &LAST_REBUILD_ERROR
    } else {
        &LAST_ERROR
    }
}

/// Opens a connection with `link`; `tune` sets the driver options (timeouts, session
/// settings). Every failure is `Unavailable` (no connection, no answer) with a text that
/// never holds the password.
pub fn open(link: &Link, tune: impl FnOnce(&mut Config)) -> Result<Client, DbErr> {
    connect_with(link, tune, |p| {
        let cfg = postgres::Config::from(p.cfg);
        match p.tls {
            None => cfg.connect(NoTls),
            Some(c) => cfg.connect(c),
        }
    })
}

/// `open` for the asynchronous driver, on the current thread's runtime `rt`, for a stream
/// read in one `block_on` (a rebuild's COPY: the blocking driver enters its runtime once per
/// row). The connection's task is spawned on `rt`.
pub fn open_async(
    link: &Link,
    rt: &tokio::runtime::Runtime,
    tune: impl FnOnce(&mut Config),
) -> Result<tokio_postgres::Client, DbErr> {
    connect_with(link, tune, |p| {
        rt.block_on(async {
            match p.tls {
                None => {
                    let (client, conn) = p.cfg.connect(NoTls).await?;
                    tokio::spawn(conn);
                    Ok(client)
                }
                Some(c) => {
                    let (client, conn) = p.cfg.connect(c).await?;
                    tokio::spawn(conn);
                    Ok(client)
                }
            }
        })
    })
}

/// A driver configuration ready to connect, and the TLS connector it needs (None: no TLS).
struct Prepared {
    cfg: Config,
    tls: Option<MakeTlsConnector>,
}

fn connect_with<C>(
    link: &Link,
    tune: impl FnOnce(&mut Config),
    connect: impl FnOnce(Prepared) -> Result<C, tokio_postgres::Error>,
) -> Result<C, DbErr> {
    let mut password = None;
    // An attempt that outlived a change of the link settings (a slow handshake while CONFIG
    // SET changed `member.pg-url`) says nothing of the settings now: its outcome is not
    // recorded, or a late failure of an old URL would show after the new one had connected.
    let generation = crate::config::pg_link_gen();
    let r = try_open(link, tune, &mut password, connect);
    let mut last = error_slot(link).lock().unwrap_or_else(|e| e.into_inner());
    let current = crate::config::pg_link_gen() == generation;
    match r {
        Ok(c) => {
            if current {
                *last = None;
            }
            Ok(c)
        }
        Err(msg) => {
            let msg = scrub(&msg, password.as_deref());
            if current {
                *last = Some(msg.clone());
            }
            Err(DbErr::Unavailable(msg))
        }
    }
}

fn try_open<C>(
    link: &Link,
    tune: impl FnOnce(&mut Config),
    password: &mut Option<String>,
    connect: impl FnOnce(Prepared) -> Result<C, tokio_postgres::Error>,
) -> Result<C, String> {
    let bad = |e: &str| format!("bad {}: {e}", link.name);
    let info = ConnInfo::parse(&link.masked).map_err(bad)?;
    let tls = info.tls().map_err(bad)?;
    let mut cfg = Config::from_str(&info.without(&TLS_KEYS)).map_err(|e| bad(&chain(&e)))?;
    *password = link.password(&info)?;
    if let Some(p) = password.as_deref() {
        cfg.password(p);
    }
    tune(&mut cfg);
    let prepared = match tls.mode {
        SslMode::Disable => {
            cfg.ssl_mode(DriverSslMode::Disable);
            Prepared { cfg, tls: None }
        }
        mode => {
            let connector = connector(&tls).map_err(|e| format!("TLS setup: {e}"))?;
            cfg.ssl_mode(match mode {
                SslMode::Prefer => DriverSslMode::Prefer,
                _ => DriverSslMode::Require,
            });
            Prepared {
                cfg,
                tls: Some(connector),
            }
        }
    };
    connect(prepared).map_err(|e| match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None if tls.mode != SslMode::Disable && is_tls(&e) => {
            format!("{} (sslmode={})", chain(&e), mode_name(tls.mode))
        }
        None => chain(&e),
    })
}

/// The OpenSSL connector for a TLS mode: no verification for prefer/require (one connector,
/// made once: prefer is the default, and a connection to a server without TLS should cost
/// no more than before); for verify-ca and verify-full only the certificates of
/// `sslrootcert` (or the system's, for `system`), read at each connection, and for
/// verify-full the host name too.
fn connector(tls: &Tls) -> Result<MakeTlsConnector, String> {
    static UNVERIFIED: OnceLock<MakeTlsConnector> = OnceLock::new();
    if matches!(tls.mode, SslMode::Prefer | SslMode::Require) {
        if let Some(c) = UNVERIFIED.get() {
            return Ok(c.clone());
        }
        let c = build(tls)?;
        return Ok(UNVERIFIED.get_or_init(|| c).clone());
    }
    build(tls)
}

fn build(tls: &Tls) -> Result<MakeTlsConnector, String> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(|e| e.to_string())?;
    match (tls.mode, tls.root_cert.as_deref()) {
        (SslMode::VerifyCa | SslMode::VerifyFull, Some("system")) => {
            b.set_default_verify_paths().map_err(|e| e.to_string())?;
        }
        (SslMode::VerifyCa | SslMode::VerifyFull, Some(file)) => {
            // A regular file of bounded size, opened without blocking: a FIFO or a device
            // named here would hang or exhaust the worker that reads it.
            let pem = crate::config::secret_file::read(file, MAX_ROOT_CERT_FILE)
                .map_err(|e| format!("cannot read sslrootcert {file}: {e}"))?;
            let load = |e: &dyn std::fmt::Display| format!("cannot load sslrootcert {file}: {e}");
            let certs = X509::stack_from_pem(&pem).map_err(|e| load(&e))?;
            if certs.is_empty() {
                return Err(load(&"no PEM certificate in it"));
            }
            // Only this file is trusted, not the system's store the builder starts with.
            let mut store = X509StoreBuilder::new().map_err(|e| e.to_string())?;
            for cert in certs {
                store.add_cert(cert).map_err(|e| load(&e))?;
            }
            b.set_cert_store(store.build());
        }
        _ => b.set_verify(SslVerifyMode::NONE),
    }
    let mut c = MakeTlsConnector::new(b.build());
    if tls.mode != SslMode::VerifyFull {
        c.set_callback(|conf, _| {
            conf.set_verify_hostname(false);
            Ok(())
        });
    }
    Ok(c)
}

fn mode_name(m: SslMode) -> &'static str {
    match m {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    }
}

fn is_tls(e: &postgres::Error) -> bool {
    e.to_string().contains("TLS") || e.to_string().contains("SSL")
}

/// The error and its causes, `outer: inner: ...`, skipping a cause its parent already said.
fn chain(e: &postgres::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let t = s.to_string();
        if !msg.contains(&t) {
            msg = format!("{msg}: {t}");
        }
        source = s.source();
    }
    msg
}
