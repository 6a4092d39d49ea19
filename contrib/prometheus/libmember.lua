-- libmember's figures for Prometheus' redis_exporter: run it as
--   redis_exporter --redis.addr redis://HOST:PORT --script libmember.lua
-- The exporter shows each pair this script returns as redis_script_values{key="<name>"} and
-- accepts numbers only (a single other value fails the whole scrape and sets redis_up to 0), so
-- text fields become 0/1 gauges here and the rest are left out:
--   member_<field>            every numeric field of INFO member (INFO prints member_<field>)
--   member_set:<set>:<field>  every numeric field of MEMBER.NODEINFO <set>, for every set
-- Set names are [a-z0-9_], so the set is the part between the two colons (the alert rules and
-- the dashboard of contrib/ take it out with label_replace). See docs/monitoring.md.

-- The sets to report, e.g. {'users', 'orgs'}. Empty: every set this node holds
-- (MEMBER.NODEINFO without a set lists them, standalone and in a cluster). member_script_sets
-- below member_sets says some set went unreported.
local SETS = {}

local out = {}
local function put(name, value)
  out[#out + 1] = name
  out[#out + 1] = value
end

-- A value the exporter parses as a number: decimal digits with an optional sign and point.
local function numeric(v)
  return type(v) == 'string' and string.match(v, '^%-?%d+%.?%d*$') ~= nil
end

local function flag(b)
  if b then return '1' end
  return '0'
end

-- Text fields as 0/1 gauges (absent fields read 0: no error, not running).
local function text_gauges(prefix, f)
  put(prefix .. 'sync_horizon_blind', flag(f.sync_horizon == 'blind'))
  if f.db_link_error ~= nil then
    put(prefix .. 'db_link_failing', flag(f.db_link_error ~= 'none'))
  end
  if f.db_history ~= nil then
    put(prefix .. 'db_history_unreadable', flag(f.db_history == 'unreadable'))
  end
  if f.rebuild_link_error ~= nil then
    put(prefix .. 'rebuild_link_failing', flag(f.rebuild_link_error ~= 'none'))
  end
  if f.sync_notify_error ~= nil then
    put(prefix .. 'sync_notify_failing', flag(f.sync_notify_error ~= 'none'))
  end
  if f.last_rebuild ~= nil then
    put(prefix .. 'last_rebuild_failed', flag(f.last_rebuild == 'failed'))
  end
  if f.rebuild_state ~= nil then
    put(prefix .. 'rebuild_running', flag(f.rebuild_state == 'running'))
  end
  if f.filter_origin ~= nil then
    put(prefix .. 'filter_origin_here', flag(f.filter_origin == 'here'))
  end
  if f.name ~= nil then
    put(prefix .. 'sync_error', flag(f.sync_last_error ~= nil))
    put(prefix .. 'auto_grow_failing', flag(f.auto_grow_error ~= nil))
  end
end

-- Fields that are numbers but no measure (a key's fingerprint).
local SKIP = { token_key_fp = true }

local function export(prefix, names, f)
  for _, k in ipairs(names) do
    if not SKIP[k] and numeric(f[k]) then
      put(prefix .. k, f[k])
    end
  end
  text_gauges(prefix, f)
end

-- INFO member: "member_<field>:<value>" lines.
local names, fields = {}, {}
for k, v in string.gmatch(redis.call('INFO', 'member'), 'member_([%w_]+):([^\r\n]*)') do
  names[#names + 1] = k
  fields[k] = v
end
export('member_', names, fields)

local sets = SETS
if #sets == 0 then
  sets = redis.call('MEMBER.NODEINFO')
end

-- MEMBER.NODEINFO <set> (MEMBER.INFO's fields, as this node serves the set: in a cluster
-- each node reports its own part): alternating names and values. A set this node cannot
-- report (dropped since the scan, or unknown here) counts in member_script_set_errors.
local reported, failed = 0, 0
for _, set in ipairs(sets) do
  local r = redis.pcall('MEMBER.NODEINFO', set)
  if type(r) == 'table' and r.err == nil then
    local n, f = {}, {}
    for i = 1, #r - 1, 2 do
      -- Names come as status replies, which Lua sees as {ok = name}.
      local k = r[i]
      if type(k) == 'table' then k = k.ok end
      n[#n + 1] = k
      f[k] = r[i + 1]
    end
    export('member_set:' .. set .. ':', n, f)
    reported = reported + 1
  else
    failed = failed + 1
  end
end
put('member_script_sets', tostring(reported))
put('member_script_set_errors', tostring(failed))
return out
