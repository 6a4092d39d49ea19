//! The per-process shared PostgreSQL cluster (started on first use, removed at exit), the test
//! roles, and `TestDb`: a database of its own for each test.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use super::pg_cluster::{Cluster, Setup};
use super::process::{stop_postmaster_at_exit, unique};

/// The per-process shared PostgreSQL cluster. Use [`fresh_db`] rather than this directly.
pub struct Pg {
    cluster: Cluster,
    admin: Mutex<Option<postgres::Client>>,
}

impl Pg {
    /// The shared cluster, started on first use; stopped and removed at process exit.
    pub fn get() -> &'static Pg {
        Self::get_with(no_setup)
    }

    /// The shared cluster prepared by `setup`, started when first asked for (all tests that
    /// ask with the same `setup` share one cluster; each `setup` has its own, so the TLS
    /// tests' cluster is not the one every other test uses).
    pub fn get_with(setup: Setup) -> &'static Pg {
        static PGS: Mutex<Vec<(usize, &'static Pg)>> = Mutex::new(Vec::new());
        let mut pgs = PGS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, pg)) = pgs.iter().find(|(s, _)| *s == setup as usize) {
            return pg;
        }
        let cluster = Cluster::create_with("member-pg", setup);
        let pid = cluster.child.as_ref().unwrap().id();
        let mut started = SHARED_PG.lock().unwrap_or_else(|e| e.into_inner());
        if started.is_empty() {
            // SAFETY: registering a plain extern "C" fn.
            unsafe {
                libc::atexit(shared_pg_atexit);
            }
        }
        started.push((pid, cluster.base.clone()));
        let pg: &'static Pg = Box::leak(Box::new(Pg {
            cluster,
            admin: Mutex::new(None),
        }));
        pgs.push((setup as usize, pg));
        pg
    }

    pub fn port(&self) -> u16 {
        self.cluster.port
    }

    /// Connection string for a database of this cluster.
    pub fn url(&self, dbname: &str) -> String {
        self.cluster.url(dbname)
    }

    pub fn client(&self, dbname: &str) -> postgres::Client {
        self.cluster.client(dbname)
    }

    /// Creates a new empty database and returns its name.
    pub fn create_db(&self) -> String {
        self.admin_sql(|name| format!("CREATE DATABASE {name}"))
    }

    /// Creates a new empty database owned by `owner` (so that role may create tables in its
    /// `public` schema, as PostgreSQL 15 allows only the owner by default).
    pub fn create_db_owned_by(&self, owner: &str) -> String {
        self.admin_sql(|name| format!("CREATE DATABASE {name} OWNER {owner}"))
    }

    /// Runs the admin statement `sql(name)` for a new database name; returns the name.
    fn admin_sql(&self, sql: impl FnOnce(&str) -> String) -> String {
        let name = format!("t_{}", unique());
        // Serialized: one admin session creates every database (and the roles).
        let mut guard = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            *guard = Some(self.cluster.client("postgres"));
        }
        // The test roles exist in every cluster (roles are cluster-wide). A separate call:
        // CREATE DATABASE refuses to run in the implicit transaction of a multi-statement batch.
        let roles = format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{MODULE_ROLE}') THEN
                 CREATE ROLE {MODULE_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
               END IF;
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                 CREATE ROLE {APP_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
               END IF;
             END $$"
        );
        let sql = sql(&name);
        let admin = guard.as_mut().unwrap();
        admin
            .batch_execute(&roles)
            .unwrap_or_else(|e| panic!("{roles}: {e}"));
        admin
            .batch_execute(&sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        name
    }
}

/// A least-privilege role for the module: it may log in and owns its test database (so it
/// owns the tables it creates), but it is neither superuser nor a member of
/// `pg_read_all_stats`: it cannot see other roles' sessions in `pg_stat_activity`.
pub const MODULE_ROLE: &str = "member_mod";
/// An application role that writes rows into a set's table from outside the module.
pub const APP_ROLE: &str = "member_app";

/// The shared clusters started (postmaster pid, base directory), stopped at exit.
static SHARED_PG: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

extern "C" fn shared_pg_atexit() {
    let started = match SHARED_PG.lock() {
        Ok(mut g) => std::mem::take(&mut *g),
        Err(_) => return,
    };
    for (pid, base) in started {
        stop_postmaster_at_exit(pid, &base);
    }
}

/// The plain shared cluster's setup: nothing beyond the defaults.
fn no_setup(_: &std::path::Path) -> Vec<String> {
    Vec::new()
}

/// A database of its own for one test, in the shared cluster.
pub struct TestDb {
    pub name: String,
}

/// Creates a new uniquely named database (`t_<pid>_<n>`) in the shared cluster.
pub fn fresh_db() -> TestDb {
    TestDb {
        name: Pg::get().create_db(),
    }
}

/// `fresh_db`, owned by [`MODULE_ROLE`] (created with [`APP_ROLE`] if missing).
pub fn fresh_db_owned_by_module_role() -> TestDb {
    TestDb {
        name: Pg::get().create_db_owned_by(MODULE_ROLE),
    }
}

impl TestDb {
    /// libpq key=value connection string (as the superuser `postgres`).
    pub fn url(&self) -> String {
        Pg::get().url(&self.name)
    }

    /// libpq key=value connection string as `user`.
    pub fn url_as(&self, user: &str) -> String {
        Pg::get().cluster.url_as(&self.name, user)
    }

    /// A session as the superuser `postgres`.
    pub fn client(&self) -> postgres::Client {
        Pg::get().client(&self.name)
    }

    /// A session as `user`.
    pub fn client_as(&self, user: &str) -> postgres::Client {
        let mut cfg: postgres::Config = self.url_as(user).parse().unwrap();
        cfg.connect_timeout(Duration::from_secs(5));
        cfg.connect(postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect as {user}: {e}"))
    }
}
