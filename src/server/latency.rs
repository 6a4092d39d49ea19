//! Slow database resolutions feed the server's LATENCY monitor as event `member-db`, so
//! `LATENCY LATEST`, `LATENCY HISTORY member-db` and `LATENCY DOCTOR` show them.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use redis_module::{raw, Context, RedisValue};

/// The event name, as `LATENCY LATEST` lists it.
pub const EVENT: &std::ffi::CStr = c"member-db";

/// The server's `latency-monitor-threshold` in ms (0: the monitor is off), as last read.
static THRESHOLD_MS: AtomicI64 = AtomicI64::new(0);

/// How often the threshold is read again (CONFIG SET takes effect within this).
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Whether a resolution that took `ms` is a sample under `threshold` (0 = monitor off: the
/// server's own API would record every sample then, so the module checks first).
pub fn is_sample(ms: i64, threshold: i64) -> bool {
    threshold > 0 && ms >= threshold
}

/// Records that a blocked client's database resolution took `took`, if the monitor wants it.
/// Main thread.
pub fn resolved(took: Duration) {
    let ms = took.as_millis().min(i64::MAX as u128) as i64;
    if !is_sample(ms, THRESHOLD_MS.load(Ordering::Relaxed)) {
        return;
    }
    if let Some(add) = unsafe { raw::RedisModule_LatencyAddSample } {
        // SAFETY: main thread (the server's latency table is not locked); the event name is a
        // NUL-terminated literal.
        unsafe { add(EVENT.as_ptr(), ms) };
    }
}

/// Reads `latency-monitor-threshold` again when due (main thread, housekeeping).
pub fn refresh(ctx: &Context, now: Instant) {
    thread_local! {
        static LAST: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }
    let due = LAST.with(|l| {
        let due = l
            .get()
            .is_none_or(|t| now.duration_since(t) >= REFRESH_EVERY);
        if due {
            l.set(Some(now));
        }
        due
    });
    if !due {
        return;
    }
    if let Ok(RedisValue::Array(v)) = ctx.call("CONFIG", &["GET", "latency-monitor-threshold"]) {
        let value = v.get(1).and_then(|x| match x {
            RedisValue::BulkString(s) | RedisValue::SimpleString(s) => s.parse().ok(),
            RedisValue::BulkRedisString(s) => s.to_string_lossy().parse().ok(),
            _ => None,
        });
        if let Some(t) = value {
            THRESHOLD_MS.store(t, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_over_a_set_threshold() {
        assert!(!is_sample(5000, 0), "monitor off: nothing is recorded");
        assert!(!is_sample(9, 10));
        assert!(is_sample(10, 10));
        assert!(is_sample(11, 1));
    }
}
