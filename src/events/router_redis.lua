#!lua name=kvprefix_1
--[[
router_redis.lua - the Redis 7 Functions library of the router index's shared store
(src/events/router_redis.c loads it with FUNCTION LOAD REPLACE at every connection; it is
embedded in the C library at build time). The library name carries the schema version:
change it with any change of the schema or of a function's arguments.

Keys (P = the router's key_prefix; gid = 8 raw bytes naming a worker fleet-wide; a block
is 8 raw bytes, the event integer big-endian):
  P:b:<block>   hash  gid -> media mask (integer; bit i = global medium i)
  P:wb:<gid>    set   the worker's blocks (for clears, removal, leftovers)
  P:w:<gid>     hash  expected (16 hex digits), known (0/1), stale (0/1), ts0 (8 raw
                      bytes: the ts of its last batch numbered 0), n (blocks), engine, dp;
                      PEXPIRE'd to the worker TTL at every batch when a TTL is set
  P:media       hash  medium name (upper case) -> global bit 0..5

Invariants (each function keeps them, atomically): g is a field of P:b:<x> exactly when x
is a member of P:wb:<g>; the mask of a field is never 0; n of P:w:<g> is the size of
P:wb:<g>. A P:wb:<g> without P:w:<g> is a leftover of an expired worker: it is cleaned
before the worker's state is made again.

Sequence numbers are 64-bit: they travel and are stored as 16 hex digits and compared as
two 32-bit halves (Lua numbers are doubles). Every call names no key (FCALL ... 0): the
store must be a standalone Redis, not a Cluster.
]]

local MAX_MEDIA = 6
local HMGET_CHUNK = 1000 -- fields per HMGET (unpack's limit is about 8000)

local function seq_parse(s)
    return tonumber(string.sub(s, 1, 8), 16), tonumber(string.sub(s, 9, 16), 16)
end

local function seq_fmt(hi, lo)
    return string.format('%08x%08x', hi, lo)
end

local function seq_cmp(ah, al, bh, bl)
    if ah ~= bh then
        return ah < bh and -1 or 1
    end
    if al ~= bl then
        return al < bl and -1 or 1
    end
    return 0
end

local function seq_next(hi, lo)
    if lo == 4294967295 then
        return hi + 1, 0
    end
    return hi, lo + 1
end

-- Remove worker gid from every block it holds; returns how many it held.
local function clear_blocks(P, gid)
    local wb = P .. ':wb:' .. gid
    local blocks = redis.call('SMEMBERS', wb)
    for i = 1, #blocks do
        redis.call('HDEL', P .. ':b:' .. blocks[i], gid)
    end
    redis.call('DEL', wb)
    return #blocks
end

-- The global bit of a medium name, registering it when create and room is left; nil when
-- the name is unknown (or no room is left: its blocks are not indexed).
local function medium_bit(P, name, create)
    name = string.upper(name)
    local b = redis.call('HGET', P .. ':media', name)
    if b then
        return tonumber(b)
    end
    if not create then
        return nil
    end
    local n = redis.call('HLEN', P .. ':media')
    if n >= MAX_MEDIA then
        return nil
    end
    redis.call('HSET', P .. ':media', name, n)
    return n
end

-- Add medium mask to gid for every 8-byte block in hashes; returns the blocks newly held.
local function store(P, gid, hashes, mask)
    local wb = P .. ':wb:' .. gid
    local added = 0
    for i = 1, #hashes - 7, 8 do
        local h = string.sub(hashes, i, i + 7)
        local k = P .. ':b:' .. h
        local old = redis.call('HGET', k, gid)
        if old then
            local o = tonumber(old)
            local m = bit.bor(o, mask)
            if m ~= o then
                redis.call('HSET', k, gid, m)
            end
        else
            redis.call('HSET', k, gid, mask)
            redis.call('SADD', wb, h)
            added = added + 1
        end
    end
    return added
end

-- Remove medium mask of gid from every block in hashes; returns the blocks no longer held.
local function remove(P, gid, hashes, mask)
    local wb = P .. ':wb:' .. gid
    local keep = bit.bnot(mask)
    local gone = 0
    for i = 1, #hashes - 7, 8 do
        local h = string.sub(hashes, i, i + 7)
        local k = P .. ':b:' .. h
        local old = redis.call('HGET', k, gid)
        if old then
            local o = tonumber(old)
            local m = bit.band(o, keep)
            if m == 0 then
                redis.call('HDEL', k, gid)
                redis.call('SREM', wb, h)
                gone = gone + 1
            elseif m ~= o then
                redis.call('HSET', k, gid, m)
            end
        end
    end
    return gone
end

-- A worker's state, or a fresh one (expects 0) when it has none; leftovers of an expired
-- worker are cleaned then. lost: the caller knew the worker, so a missing state means the
-- store lost it (restart, flush, expiry): its history is given up and the batch applied.
local function worker_state(P, gid, seq_zero, knew)
    local wk = P .. ':w:' .. gid
    local st = redis.call('HMGET', wk, 'expected', 'known', 'stale', 'ts0', 'n')
    if st[1] then
        local eh, el = seq_parse(st[1])
        return {eh = eh, el = el, known = st[2] == '1', stale = st[3] == '1',
                ts0 = st[4] or string.rep('\0', 8), n = tonumber(st[5] or '0'), lost = 0}
    end
    clear_blocks(P, gid)
    local lost = (not seq_zero) and knew == '1'
    return {eh = 0, el = 0, known = not lost, stale = false, ts0 = string.rep('\0', 8), n = 0,
            lost = lost and 1 or 0, new = true}
end

-- Where seq places: 1 applied, 2 restarted, 3 duplicate, 4 gap (as router_apply.c).
local function place(w, sh, sl, ts)
    local c = seq_cmp(sh, sl, w.eh, w.el)
    if not w.known or c == 0 then
        return 1
    end
    if sh == 0 and sl == 0 and (w.eh > 0 or w.el > 1 or ts ~= w.ts0) then
        return 2
    end
    return c < 0 and 3 or 4
end

-- Apply events a[i .. i + 3 * n_ev) (type, medium, hashes) to worker w; returns whether
-- one was AllBlocksCleared.
local function apply_events(P, gid, w, a, i, n_ev)
    local cleared = false
    for e = 0, n_ev - 1 do
        local t, m, hs = a[i + 3 * e], a[i + 3 * e + 1], a[i + 3 * e + 2]
        if t == 'C' then
            clear_blocks(P, gid)
            w.n = 0
            cleared = true
        else
            local b = medium_bit(P, m, t == 'S')
            if b then
                local mask = bit.lshift(1, b)
                if t == 'S' then
                    w.n = w.n + store(P, gid, hs, mask)
                else
                    w.n = w.n - remove(P, gid, hs, mask)
                end
            end
        end
    end
    return cleared
end

-- One batch at a[i ..]: gid, seq (16 hex), ts (8 raw bytes), knew (0/1), engine, dp,
-- n_events, then per event: type (S, R or C), medium, hashes (8 raw bytes each). Returns
-- its result {status, expected (16 hex), stale (0/1), lost (0/1)} and the next index.
local function apply_batch(P, ttl, a, i)
    local gid, ts, knew = a[i], a[i + 2], a[i + 3]
    local engine, dp, n_ev = a[i + 4], a[i + 5], tonumber(a[i + 6])
    local sh, sl = seq_parse(a[i + 1])
    local wk = P .. ':w:' .. gid
    local w = worker_state(P, gid, sh == 0 and sl == 0, knew)
    local status = place(w, sh, sl, ts)
    if status >= 3 then
        if not w.new and ttl > 0 then
            redis.call('PEXPIRE', wk, ttl)
        end
        return {status, seq_fmt(w.eh, w.el), w.stale and 1 or 0, w.lost}, i + 7 + 3 * n_ev
    end
    if status == 2 then
        clear_blocks(P, gid)
        w.n = 0
    end
    local exact = apply_events(P, gid, w, a, i + 7, n_ev) or (sh == 0 and sl == 0)
    if exact then
        w.stale = false
    end
    if sh == 0 and sl == 0 then
        w.ts0 = ts
    end
    local eh, el = seq_next(sh, sl)
    redis.call('HSET', wk, 'expected', seq_fmt(eh, el), 'known', '1', 'stale',
               w.stale and '1' or '0', 'ts0', w.ts0, 'n', w.n, 'engine', engine, 'dp', dp)
    if ttl > 0 then
        redis.call('PEXPIRE', wk, ttl)
    end
    return {status, seq_fmt(eh, el), w.stale and 1 or 0, w.lost}, i + 7 + 3 * n_ev
end

-- kvprefix_apply: ARGV P, ttl_ms, n_batches, then each batch (apply_batch). All batches
-- in one atomic call, in order. Returns one result per batch.
local function kvprefix_apply(keys, a)
    local P, ttl, n = a[1], tonumber(a[2]), tonumber(a[3])
    local out = {}
    local i = 4
    for b = 1, n do
        out[b], i = apply_batch(P, ttl, a, i)
    end
    return out
end

-- kvprefix_mark_stale: ARGV P, ttl_ms, gid, engine, dp. Clears the worker's blocks and
-- marks it stale, its sequence unknown (it takes its next batch whatever its number).
local function kvprefix_mark_stale(keys, a)
    local P, ttl, gid = a[1], tonumber(a[2]), a[3]
    local wk = P .. ':w:' .. gid
    clear_blocks(P, gid)
    if not redis.call('HGET', wk, 'expected') then
        redis.call('HSET', wk, 'expected', seq_fmt(0, 0))
    end
    redis.call('HSET', wk, 'known', '0', 'stale', '1', 'n', 0, 'engine', a[4], 'dp', a[5])
    if ttl > 0 then
        redis.call('PEXPIRE', wk, ttl)
    end
    return 1
end

-- kvprefix_resync: ARGV P, gid. A stale worker scores again (nothing if it has no state).
local function kvprefix_resync(keys, a)
    local wk = a[1] .. ':w:' .. a[2]
    if redis.call('EXISTS', wk) == 1 then
        redis.call('HSET', wk, 'stale', '0')
        return 1
    end
    return 0
end

-- kvprefix_remove: ARGV P, gid. Removes the worker's blocks and state, fleet-wide.
local function kvprefix_remove(keys, a)
    clear_blocks(a[1], a[2])
    return redis.call('DEL', a[1] .. ':w:' .. a[2])
end

-- HMGET key fields[1 .. n] in chunks.
local function hmget(key, fields)
    if #fields <= HMGET_CHUNK then
        return redis.call('HMGET', key, unpack(fields))
    end
    local out = {}
    for s = 1, #fields, HMGET_CHUNK do
        local e = math.min(s + HMGET_CHUNK - 1, #fields)
        local v = redis.call('HMGET', key, unpack(fields, s, e))
        for x = 1, #v do
            out[s + x - 1] = v[x]
        end
    end
    return out
end

-- kvprefix_score: ARGV P, gids (8 raw bytes each), blocks (8 raw bytes each, block 0
-- first). Per gid: its longest run of consecutive blocks from block 0, stopping at the
-- first block no running gid holds. Returns {media, rows}: media the P:media hash as a
-- flat name, bit list; rows one per gid, {state, n_blocks, mask, count, mask, count ...}
-- with state 0 scored, 1 stale, 2 no state (holds nothing) and the run's media masks as
-- (mask, how many consecutive blocks) pairs in block order.
local function kvprefix_score(keys, a)
    local P, gids, blocks = a[1], a[2], a[3]
    local rows, gid, run = {}, {}, {}
    for j = 1, math.floor(#gids / 8) do
        gid[j] = string.sub(gids, 8 * j - 7, 8 * j)
        local s = redis.call('HGET', P .. ':w:' .. gid[j], 'stale')
        if s == '0' then
            rows[j] = {0, 0}
            run[#run + 1] = j
        else
            rows[j] = {s and 1 or 2, 0}
        end
    end
    local last = {}
    for i = 1, math.floor(#blocks / 8) do
        if #run == 0 then
            break
        end
        local fields = {}
        for x = 1, #run do
            fields[x] = gid[run[x]]
        end
        local v = hmget(P .. ':b:' .. string.sub(blocks, 8 * i - 7, 8 * i), fields)
        local still = {}
        for x = 1, #run do
            if v[x] then
                local j, m = run[x], tonumber(v[x])
                local row = rows[j]
                row[2] = row[2] + 1
                if last[j] == m then
                    row[#row] = row[#row] + 1
                else
                    row[#row + 1] = m
                    row[#row + 1] = 1
                    last[j] = m
                end
                still[#still + 1] = j
            end
        end
        run = still
    end
    return {redis.call('HGETALL', P .. ':media'), rows}
end

redis.register_function('kvprefix_apply', kvprefix_apply)
redis.register_function('kvprefix_mark_stale', kvprefix_mark_stale)
redis.register_function('kvprefix_resync', kvprefix_resync)
redis.register_function('kvprefix_remove', kvprefix_remove)
redis.register_function{function_name = 'kvprefix_score', callback = kvprefix_score,
                        flags = {'no-writes'}}
