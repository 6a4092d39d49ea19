//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`): the module declares it can take
//! part, on Valkey ≥ 9.0 only, and follows the migration's events so that slot ownership moves
//! with them (`cluster::owner::slot_migration`; what each event means is
//! `model::slot_migration`). The only room that reads the event's raw data.

use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, Context, RedisValue};

use crate::model::slot_migration::{self, Step};

/// `ValkeyModuleSlotRange` (valkeymodule.h, Valkey 9.0): inclusive.
#[repr(C)]
struct SlotRange {
    start: c_int,
    end: c_int,
}

/// `ValkeyModuleAtomicSlotMigrationInfoV1` (valkeymodule.h, Valkey 9.0).
#[repr(C)]
struct MigrationInfoV1 {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

/// True when the server is Valkey 9.0 or later (its `INFO server`), read once at load.
pub fn server_has_asm(ctx: &Context) -> bool {
    let info = match ctx.call("INFO", &["server"]) {
        Ok(RedisValue::BulkString(s)) | Ok(RedisValue::SimpleString(s)) => s,
        Ok(RedisValue::StringBuffer(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(RedisValue::BulkRedisString(s)) => s.to_string_lossy(),
        _ => return false,
    };
    slot_migration::server_has_asm(&info)
}

/// The module options the server gets: `base`, plus the declaration that the module handles
/// atomic slot migration when `asm` (one call: the server keeps the last set it is given).
pub fn set_options(ctx: &Context, base: c_int, asm: bool) {
    let options = if asm {
        base | slot_migration::OPTION_HANDLE_ATOMIC_SLOT_MIGRATION
    } else {
        base
    };
    // SAFETY: module load, main thread.
    unsafe { raw::RedisModule_SetModuleOptions.unwrap()(ctx.ctx, options) };
}

/// Subscribes to the atomic slot migration event. Call once from module load, on a server
/// that has it (`server_has_asm`).
pub fn subscribe(ctx: &Context) -> Result<(), &'static str> {
    let event = raw::RedisModuleEvent {
        id: slot_migration::EVENT_ID,
        dataver: 1,
    };
    // SAFETY: module load, main thread; the callback is a plain extern "C" fn.
    let rc =
        unsafe { raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, event, Some(on_event)) };
    if rc != raw::REDISMODULE_OK as i32 {
        return Err("libmember: cannot subscribe to atomic slot migration events");
    }
    Ok(())
}

/// One step of a migration job: its slots change hands (or not) as `model::slot_migration`
/// says. An unknown subevent or data the module cannot read changes nothing.
///
/// # Safety
/// Called by the server on the main thread; `data` is a `ValkeyModuleAtomicSlotMigrationInfoV1`
/// (or null), valid for the call.
unsafe extern "C" fn on_event(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    sub: u64,
    data: *mut c_void,
) {
    let Some(step) = Step::from_subevent(sub) else {
        return;
    };
    // SAFETY: for this event the server passes this structure (or null).
    let Some(info) = (unsafe { data.cast::<MigrationInfoV1>().as_ref() }) else {
        return;
    };
    let ranges: Vec<(u16, u16)> = if info.slot_ranges.is_null() {
        Vec::new()
    } else {
        // SAFETY: the server's array of `num_slot_ranges` ranges, alive for the call.
        let raw =
            unsafe { std::slice::from_raw_parts(info.slot_ranges, info.num_slot_ranges as usize) };
        raw.iter()
            .filter_map(|r| Some((u16::try_from(r.start).ok()?, u16::try_from(r.end).ok()?)))
            .collect()
    };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        crate::cluster::owner::slot_migration(step, &ranges);
        crate::server::metrics::global(|m| m.slot_migration_events += 1);
    }));
}
