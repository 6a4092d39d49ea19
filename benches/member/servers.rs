//! The servers a run measures: checks the release module, starts PostgreSQL and valkey-server,
//! loads the members, the application pattern's keys and warm caches.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use crate::*;

/// The module the harness will load: target/release/deps/libmember.so beside this binary (or
/// MEMBER_MODULE). `cargo bench` does not build the cdylib, so it must exist and be at least as
/// new as the sources.
pub(crate) fn check_module() -> PathBuf {
    let module = support::module_path();
    progress(&format!("module: {}", module.display()));
    let overridden = std::env::var_os("MEMBER_MODULE").is_some();
    let Ok(meta) = std::fs::metadata(&module) else {
        eprintln!(
            "bench: {} not found: run `cargo build --release` first (`make bench` does)",
            module.display()
        );
        std::process::exit(2);
    };
    if overridden {
        return module;
    }
    if !module.components().any(|c| c.as_os_str() == "release") {
        progress("warning: not a release build of the module");
    }
    let newest_src = newest_mtime(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src"));
    if let (Ok(built), Some(src)) = (meta.modified(), newest_src) {
        if src > built {
            eprintln!(
                "bench: {} is older than src/: run `cargo build --release` first (`make bench` does)",
                module.display()
            );
            std::process::exit(2);
        }
    }
    module
}

pub(crate) fn newest_mtime(dir: &std::path::Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let m = if e.path().is_dir() {
            newest_mtime(&e.path())
        } else {
            e.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(m);
    }
    newest
}

impl Bench {
    pub(crate) fn extra(opts: &Opts) -> Vec<(&'static str, String)> {
        let mut v = vec![];
        if let Some(w) = opts.workers {
            v.push(("member.workers", w.to_string()));
        }
        // The peer the negative path is compared with, on the same server (`make bench`
        // unpacks it first: scripts/redisbloom.sh).
        if let Some(rb) = redisbloom() {
            v.push(("loadmodule", rb));
        }
        v
    }

    pub(crate) fn start_valkey(db: &support::TestDb, opts: &Opts) -> support::Valkey {
        let extra = Self::extra(opts);
        let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        start_loaded(&db.url(), &extra)
    }

    pub(crate) fn create(c: &mut redis::Connection, n: u64) {
        let _: String = redis::cmd("MEMBER.CREATE")
            .arg(SET)
            .arg("ERROR")
            .arg(CONFIGURED_FPR)
            .arg("CAPACITY")
            .arg(n)
            .arg("CACHE-TTL")
            .arg(CACHE_TTL_S)
            .query(c)
            .expect("MEMBER.CREATE");
    }

    /// PostgreSQL, Valkey, N members in the table and in the filter, the application
    /// pattern's keys, warm caches.
    pub(crate) fn setup(opts: Opts) -> Bench {
        let n = opts.members;
        progress("starting PostgreSQL and valkey-server");
        let db = support::fresh_db();
        let mut vk = Self::start_valkey(&db, &opts);
        let mut c = vk.conn();
        Self::create(&mut c, n);

        progress(&format!("loading {} members with SQL", thousands(n)));
        let t0 = Instant::now();
        let mut pg = db.client();
        pg.batch_execute(&format!(
            "INSERT INTO {TABLE} (entity_id) SELECT 'm' || g FROM generate_series(1, {n}) g"
        ))
        .expect("load members");
        // Set hint bits and the visibility map now, so neither the filter build nor the COPY
        // baseline pays for the first read of fresh rows.
        pg.batch_execute(&format!("VACUUM (ANALYZE) {TABLE}"))
            .expect("vacuum");
        pg.batch_execute("CHECKPOINT").expect("checkpoint");
        progress(&format!("  loaded in {:.1} s", t0.elapsed().as_secs_f64()));

        let mut rebuild_available = true;
        let mut startup_build = None;
        match redis::cmd("MEMBER.REBUILD")
            .arg(SET)
            .arg("SYNC")
            .query::<i64>(&mut c)
        {
            Ok(rows) => progress(&format!("MEMBER.REBUILD SYNC loaded {rows} members")),
            Err(e) if is_unknown_command(&e) => {
                rebuild_available = false;
                progress("MEMBER.REBUILD is not in this build: building the filter on a fresh valkey-server instead");
                drop(c);
                drop(vk);
                let extra = Self::extra(&opts);
                let extra: Vec<(&str, &str)> =
                    extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
                vk = support::start_with(&db.url(), &extra);
                c = vk.conn();
                assert!(
                    wait_catalog_loaded(&mut c, Duration::from_secs(60)),
                    "catalog never loaded:\n{}",
                    vk.log()
                );
                // The build starts from the next housekeeping pass after the catalog load.
                let pinger = Pinger::start(vk.port());
                let done = support::wait_until(Duration::from_secs(1800), || {
                    let i = set_info_all(&mut c);
                    i.get("filter_complete").map(String::as_str) == Some("1")
                        && i.get("last_rebuild").map(String::as_str) == Some("ok")
                });
                let pings = pinger.finish();
                assert!(done, "the filter was never built:\n{}", vk.log());
                let info = set_info_all(&mut c);
                startup_build = Some((num(&info, "last_rebuild_s"), pings));
                Self::create(&mut c, n);
            }
            Err(e) => panic!("MEMBER.REBUILD {SET} SYNC: {e}"),
        }
        let info = set_info_all(&mut c);
        let items = num(&info, "filter_items") as u64;
        assert!(
            info.get("filter_complete").map(String::as_str) == Some("1")
                && items as f64 >= n as f64 * 0.99,
            "filter not built from the table: {info:?}"
        );

        let port = vk.port();
        let warm = 20_000.min(n / 10);
        let mut b = Bench {
            opts,
            db,
            vk,
            port,
            warm,
            cold_next: AtomicU64::new(n / 2 + 1),
            rebuild_available,
            startup_build,
            r: Report::default(),
        };
        b.load_app_pattern();
        b.warm_caches();
        b
    }

    /// The application-level pattern's state: the members in a Valkey SET, an empty recent
    /// set, and a present key for the bare GET.
    pub(crate) fn load_app_pattern(&mut self) {
        let n = self.opts.members;
        progress(&format!(
            "loading {} members into the Valkey SET {APP_SET}",
            thousands(n)
        ));
        let t0 = Instant::now();
        let mut c = self.vk.conn();
        let mut i = 1;
        while i <= n {
            let mut p = redis::pipe();
            for _ in 0..10 {
                if i > n {
                    break;
                }
                let end = (i + 999).min(n);
                let mut cmd = redis::cmd("SADD");
                cmd.arg(APP_SET);
                for k in i..=end {
                    cmd.arg(format!("m{k}"));
                }
                p.add_command(cmd).ignore();
                i = end + 1;
            }
            p.query::<()>(&mut c).expect("SADD");
        }
        let _: () = redis::cmd("SET")
            .arg(PRESENT_KEY)
            .arg("1")
            .query(&mut c)
            .unwrap();
        progress(&format!("  loaded in {:.1} s", t0.elapsed().as_secs_f64()));
    }

    /// Fills the module's cache for m1..=warm (one EXISTS each) and the application
    /// pattern's cache for the same items.
    pub(crate) fn warm_caches(&mut self) {
        progress(&format!(
            "warming the caches: {} present items",
            thousands(self.warm)
        ));
        let st = raw_total(self.port, self.warm, &|i: u64, buf: &mut Vec<u8>| {
            let item = format!("m{}", i + 1);
            push_cmd(buf, &[b"MEMBER.EXISTS", SET.as_bytes(), item.as_bytes()]);
            Expect::Yes
        });
        assert!(
            st.errors == 0 && st.wrong == 0,
            "warming EXISTS failed: {st:?}"
        );
        let mut c = self.vk.conn();
        let mut p = redis::pipe();
        for i in 1..=self.warm {
            p.cmd("SET")
                .arg(format!("{APP_HIT}m{i}"))
                .arg("1")
                .arg("EX")
                .arg(CACHE_TTL_S)
                .ignore();
            if i % 1000 == 0 || i == self.warm {
                p.query::<()>(&mut c).expect("SET app cache");
                p = redis::pipe();
            }
        }
        let (a, path): (i64, String) = redis::cmd("MEMBER.EXPLAIN")
            .arg(SET)
            .arg("m1")
            .query(&mut c)
            .unwrap();
        assert_eq!((a, path.as_str()), (1, "cache-hit"), "cache not warm");
    }

    pub(crate) fn half(&self) -> Duration {
        Duration::from_secs_f64(self.opts.secs / 2.0)
    }
}

/// RedisBloom's module as scripts/redisbloom.sh unpacks it, when it is there.
pub(crate) fn redisbloom() -> Option<String> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/servers/redisbloom-2.8.2/redisbloom.so");
    p.exists().then(|| p.display().to_string())
}
