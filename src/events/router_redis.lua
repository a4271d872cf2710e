#!lua name=kvprefix_1
--[[
router_redis.lua - the Redis 7 Functions library of the router index's shared store
(src/events/router_redis.c loads it with FUNCTION LOAD REPLACE at every connection; it is
embedded in the C library at build time). The library name carries the schema version:
change it with any change of the schema or of a function's arguments.

Keys (P = the router's key_prefix; gid = 8 raw bytes naming a worker fleet-wide; a block
is 8 raw bytes, the event integer big-endian):
  P:wm:<gid>    hash  block -> media mask (integer; bit i = global medium i): the blocks
                      the worker holds
  P:w:<gid>     hash  expected (16 hex digits), known (0/1), stale (0/1), full (0/1:
                      the shared view holds every block the worker holds, as far as the
                      batches applied tell; 0 after the state was lost and remade, or a
                      stale mark, until an exact batch or a re-seed), ts0 (8 raw
                      bytes: the ts of its last batch numbered 0), n (blocks), engine, dp
  P:media       hash  medium name (upper case) -> global bit 0..5
With a worker TTL, P:w and P:wm are PEXPIRE'd together at every batch.

Why one hash per worker and not one per block (llm-d's layout; this library's first
version): measured with INFO memory on Redis 7.0, a (block, worker) pair costs 67 bytes
here whatever the sharing, against 172 (1 holder per block), 118 (2), 88 (8) and 83 (64)
bytes with a hash per block plus a set per worker for clears; a clear, restart or
removal is one UNLINK instead of a walk over the worker's blocks; and a score's lookups
are O(1) hash-table probes (HMGET on the worker's hash, in growing chunks) where a
64-holder block hash is a listpack searched linearly per field. See docs/routing.md.

Invariants (each function keeps them, atomically): a mask is never 0; n of P:w:<g> is
the length of P:wm:<g>. A P:wm:<g> without P:w:<g> is a leftover (its state expired or
was lost alone): it is deleted before the worker's state is made again.

Sequence numbers are 64-bit: they travel and are stored as 16 hex digits and compared as
two 32-bit halves (Lua numbers are doubles). Every call names no key (FCALL ... 0): the
store must be a standalone Redis, not a Cluster.
]]

local MAX_MEDIA = 6

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

-- Forget every block of worker gid (UNLINK: freed in the background).
local function clear_blocks(P, gid)
    redis.call('UNLINK', P .. ':wm:' .. gid)
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

-- Add medium mask to gid for every 8-byte block in hashes.
local function store(P, gid, hashes, mask)
    local wm = P .. ':wm:' .. gid
    for i = 1, #hashes - 7, 8 do
        local h = string.sub(hashes, i, i + 7)
        local old = redis.call('HGET', wm, h)
        if not old then
            redis.call('HSET', wm, h, mask)
        else
            local o = tonumber(old)
            local m = bit.bor(o, mask)
            if m ~= o then
                redis.call('HSET', wm, h, m)
            end
        end
    end
end

-- Remove medium mask of gid from every block in hashes.
local function remove(P, gid, hashes, mask)
    local wm = P .. ':wm:' .. gid
    local keep = bit.bnot(mask)
    for i = 1, #hashes - 7, 8 do
        local h = string.sub(hashes, i, i + 7)
        local old = redis.call('HGET', wm, h)
        if old then
            local o = tonumber(old)
            local m = bit.band(o, keep)
            if m == 0 then
                redis.call('HDEL', wm, h)
            elseif m ~= o then
                redis.call('HSET', wm, h, m)
            end
        end
    end
end

-- A worker's state, or a fresh one (expects 0) when it has none; leftovers of an expired
-- worker are cleaned then. lost: the caller knew the worker, so a missing state means the
-- store lost it (restart, flush, expiry): its history is given up and the batch applied.
local function worker_state(P, gid, seq_zero, knew)
    local wk = P .. ':w:' .. gid
    local st = redis.call('HMGET', wk, 'expected', 'known', 'stale', 'ts0', 'full')
    if st[1] then
        local eh, el = seq_parse(st[1])
        return {eh = eh, el = el, known = st[2] == '1', stale = st[3] == '1',
                ts0 = st[4] or string.rep('\0', 8), full = st[5] ~= '0', lost = 0}
    end
    clear_blocks(P, gid)
    local lost = (not seq_zero) and knew == '1'
    return {eh = 0, el = 0, known = not lost, stale = false, ts0 = string.rep('\0', 8),
            full = not lost, lost = lost and 1 or 0, new = true}
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
            cleared = true
        else
            local b = medium_bit(P, m, t == 'S')
            if b then
                local mask = bit.lshift(1, b)
                if t == 'S' then
                    store(P, gid, hs, mask)
                else
                    remove(P, gid, hs, mask)
                end
            end
        end
    end
    return cleared
end

-- One batch at a[i ..]: gid, seq (16 hex), ts (8 raw bytes), knew (0/1), engine, dp,
-- n_events, then per event: type (S, R or C), medium, hashes (8 raw bytes each). Returns
-- its result {status, expected (16 hex), stale (0/1), lost (0/1), full (0/1)} and the
-- next index.
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
            redis.call('PEXPIRE', P .. ':wm:' .. gid, ttl)
        end
        return {status, seq_fmt(w.eh, w.el), w.stale and 1 or 0, w.lost, w.full and 1 or 0},
               i + 7 + 3 * n_ev
    end
    if status == 2 then
        clear_blocks(P, gid)
    end
    local exact = apply_events(P, gid, w, a, i + 7, n_ev) or (sh == 0 and sl == 0)
    if exact then
        w.stale = false
        w.full = true
    end
    if sh == 0 and sl == 0 then
        w.ts0 = ts
    end
    local eh, el = seq_next(sh, sl)
    local wm = P .. ':wm:' .. gid
    redis.call('HSET', wk, 'expected', seq_fmt(eh, el), 'known', '1', 'stale',
               w.stale and '1' or '0', 'ts0', w.ts0, 'n', redis.call('HLEN', wm), 'engine',
               engine, 'dp', dp, 'full', w.full and '1' or '0')
    if ttl > 0 then
        redis.call('PEXPIRE', wk, ttl)
        redis.call('PEXPIRE', wm, ttl)
    end
    return {status, seq_fmt(eh, el), w.stale and 1 or 0, w.lost, w.full and 1 or 0},
           i + 7 + 3 * n_ev
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
    redis.call('HSET', wk, 'known', '0', 'stale', '1', 'full', '0', 'n', 0, 'engine', a[4],
               'dp', a[5])
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

-- Block i of blocks (8 raw bytes each), cut once per call into bk.
local function block_at(blocks, bk, i)
    local b = bk[i]
    if not b then
        b = string.sub(blocks, 8 * i - 7, 8 * i)
        bk[i] = b
    end
    return b
end

-- Values of blocks from .. to in the worker's hash: HMGET, or the table held (the whole
-- hash, read once) when given.
local function values(wm, blocks, bk, from, to, held)
    local v = {}
    if held then
        for i = from, to do
            v[i - from + 1] = held[block_at(blocks, bk, i)] or false
        end
        return v
    end
    local fields = {}
    for i = from, to do
        fields[i - from + 1] = block_at(blocks, bk, i)
    end
    return redis.call('HMGET', wm, unpack(fields))
end

-- The whole hash wm as a table block -> mask (string), when it is small enough that its
-- encoding may be a listpack (where each HMGET field is a linear search: measured 500 us
-- per 512-field HMGET on a 512-entry listpack); else nil.
local SMALL_HASH = 1024
local function small_hash(wm)
    if redis.call('HLEN', wm) > SMALL_HASH then
        return nil
    end
    local all, held = redis.call('HGETALL', wm), {}
    for x = 1, #all, 2 do
        held[all[x]] = all[x + 1]
    end
    return held
end

-- One worker's run over blocks: block 0 by HGET (a worker without it has no run), then
-- the first FIRST_CHUNK blocks by HMGET; if all are held,
-- the rest from the whole hash when it is small (small_hash), else by HMGET in chunks
-- growing 4 times (hash-table probes), up to MAX_CHUNK. Returns {0, n_blocks, mask,
-- count, mask, count ...}: the run's media masks as (mask, consecutive blocks) pairs in
-- block order. Masks stay strings until they change (the loop is the score's hot path).
local FIRST_CHUNK, MAX_CHUNK = 32, 4096
local function run_of(wm, blocks, bk)
    local n_blocks = math.floor(#blocks / 8)
    if n_blocks == 0 or not redis.call('HGET', wm, block_at(blocks, bk, 1)) then
        return {0, 0} -- most workers of a fleet: one field read, not FIRST_CHUNK
    end
    local row, n, k, last, cnt = {0, 0}, 0, 2, nil, 0
    local from, chunk, held = 1, FIRST_CHUNK, nil
    while from <= n_blocks do
        local to = math.min(from + chunk - 1, n_blocks)
        local v = values(wm, blocks, bk, from, to, held)
        local got = to - from + 1
        for x = 1, got do
            local m = v[x]
            if not m then
                got = x - 1
                break
            end
            if m == last then
                cnt = cnt + 1
            else
                if last then
                    row[k + 1], row[k + 2], k = tonumber(last), cnt, k + 2
                end
                last, cnt = m, 1
            end
        end
        n = n + got
        if got < to - from + 1 then
            break
        end
        if from == 1 and to < n_blocks then
            held = small_hash(wm)
        end
        chunk = held and n_blocks or math.min(chunk * 4, MAX_CHUNK)
        from = to + 1
    end
    if last then
        row[k + 1], row[k + 2] = tonumber(last), cnt
    end
    row[2] = n
    return row
end

-- kvprefix_score: ARGV P, gids (8 raw bytes each), blocks (8 raw bytes each, block 0
-- first). Per gid: its longest run of consecutive blocks from block 0 (a run never
-- passes a block no worker holds, so the group's stop is implied). Returns {media, rows}:
-- media the P:media hash as a flat name, bit list; rows one per gid: {0, n_blocks, mask,
-- count ...} (run_of) for a fresh worker, {1, 0} for a stale one, {2, 0} for a worker
-- without state (never seen, expired or lost: it holds nothing).
local function kvprefix_score(keys, a)
    local P, gids, blocks = a[1], a[2], a[3]
    local rows, bk = {}, {}
    for j = 1, math.floor(#gids / 8) do
        local gid = string.sub(gids, 8 * j - 7, 8 * j)
        local s = redis.call('HGET', P .. ':w:' .. gid, 'stale')
        if s == '0' then
            rows[j] = run_of(P .. ':wm:' .. gid, blocks, bk)
        else
            rows[j] = {s and 1 or 2, 0}
        end
    end
    return {redis.call('HGETALL', P .. ':media'), rows}
end

-- kvprefix_reseed: ARGV P, ttl_ms, gid, expected (16 hex), whole (0/1), n_media, then
-- n_media pairs (medium, blocks: 8 raw bytes each). A router puts its local view of a
-- worker, taken at `expected`, into the shared view: only if the state still expects
-- `expected` and is fresh (no other router moved it since). Every block of a local view
-- that is not stale is held, so the shared view stays a subset of the truth; when the
-- sender's view is whole, the union is the worker's whole view and the state is marked
-- full. Returns 1 when re-seeded, 0 when not.
local function kvprefix_reseed(keys, a)
    local P, ttl, gid = a[1], tonumber(a[2]), a[3]
    local wk, wm = P .. ':w:' .. gid, P .. ':wm:' .. gid
    local st = redis.call('HMGET', wk, 'expected', 'stale', 'full')
    if st[1] ~= a[4] or st[2] ~= '0' then
        return 0
    end
    for i = 7, 6 + 2 * tonumber(a[6]), 2 do
        local b = medium_bit(P, a[i], true)
        if b then
            store(P, gid, a[i + 1], bit.lshift(1, b))
        end
    end
    local full = (a[5] == '1' or st[3] ~= '0') and '1' or '0'
    redis.call('HSET', wk, 'n', redis.call('HLEN', wm), 'full', full)
    if ttl > 0 then
        redis.call('PEXPIRE', wm, ttl)
    end
    return 1
end

-- The checker's part for P:media: returns the mask of registered bits, or nil and why.
local function check_media(P)
    local media = redis.call('HGETALL', P .. ':media')
    local ok_bits = 0
    for x = 1, #media, 2 do
        local b = tonumber(media[x + 1])
        if not b or b < 0 or b >= MAX_MEDIA or b ~= math.floor(b) then
            return nil, 'media: a bit outside 0..5'
        end
        if bit.band(ok_bits, bit.lshift(1, b)) ~= 0 then
            return nil, 'media: a bit given twice'
        end
        if media[x] ~= string.upper(media[x]) then
            return nil, 'media: a name not in upper case'
        end
        ok_bits = bit.bor(ok_bits, bit.lshift(1, b))
    end
    return ok_bits
end

-- The keys P .. infix .. <gid> (other fleets' keys that the pattern also matches, whose
-- prefix extends P, are longer and skipped), as {key, gid} pairs.
local function keys_of(P, infix)
    local out = {}
    local pre = P .. infix
    for _, k in ipairs(redis.call('KEYS', pre .. '*')) do
        if #k == #pre + 8 and string.sub(k, 1, #pre) == pre then
            out[#out + 1] = {k, string.sub(k, #pre + 1)}
        end
    end
    return out
end

-- kvprefix_check: ARGV P. Walks every key of the prefix (KEYS: for tests and debugging,
-- not for a busy server) and checks the invariants: media bits 0..5, unique, names in
-- upper case; each worker state well formed (expected 16 hex digits, known, stale and full 0
-- or 1, n the length of its block hash); each block key 8 bytes with a mask of registered
-- bits, never 0. Returns {1, 'ok'} or {0, why}.
local function kvprefix_check(keys, a)
    local P = a[1]
    local ok_bits, why = check_media(P)
    if not ok_bits then
        return {0, why}
    end
    for _, kg in ipairs(keys_of(P, ':w:')) do
        local st = redis.call('HMGET', kg[1], 'expected', 'known', 'stale', 'n', 'full')
        if not st[1] or #st[1] ~= 16 or not string.match(st[1], '^%x+$') then
            return {0, 'worker state: expected is not 16 hex digits'}
        end
        if (st[2] ~= '0' and st[2] ~= '1') or (st[3] ~= '0' and st[3] ~= '1') or
            (st[5] ~= '0' and st[5] ~= '1') then
            return {0, 'worker state: known, stale or full is not 0 or 1'}
        end
        if tonumber(st[4] or '-1') ~= redis.call('HLEN', P .. ':wm:' .. kg[2]) then
            return {0, 'worker state: n differs from the blocks held'}
        end
    end
    for _, kg in ipairs(keys_of(P, ':wm:')) do
        local all = redis.call('HGETALL', kg[1])
        for x = 1, #all, 2 do
            local m = tonumber(all[x + 1])
            if #all[x] ~= 8 then
                return {0, 'blocks: a block key is not 8 bytes'}
            end
            if not m or m < 1 or m > 63 or bit.band(m, bit.bnot(ok_bits)) ~= 0 then
                return {0, 'blocks: a mask is 0 or names an unregistered medium'}
            end
        end
    end
    return {1, 'ok'}
end

redis.register_function('kvprefix_apply', kvprefix_apply)
redis.register_function('kvprefix_mark_stale', kvprefix_mark_stale)
redis.register_function('kvprefix_resync', kvprefix_resync)
redis.register_function('kvprefix_remove', kvprefix_remove)
redis.register_function('kvprefix_reseed', kvprefix_reseed)
redis.register_function{function_name = 'kvprefix_check', callback = kvprefix_check,
                        flags = {'no-writes'}}
redis.register_function{function_name = 'kvprefix_score', callback = kvprefix_score,
                        flags = {'no-writes'}}
