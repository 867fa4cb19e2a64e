-- Puts the in-flight jobs of workers presumed dead (no heartbeat since
-- ARGV[1]) back at the front of the queue (of the list of their level, the
-- meta hash's `priority`; none is the active list), at most ARGV[2] jobs per call so
-- that one call never blocks Redis for long, whatever a dead worker held.
-- A worker leaves the workers set once its in-flight set is empty.
--
-- KEYS[1] workers: zset, worker name -> last heartbeat (seconds)
-- KEYS[2] active list (a level's list is KEYS[2] .. ':p' .. level)
-- KEYS[3] prefix of the in-flight sets (<prefix>:<worker>)
-- KEYS[4] prefix of the per-job meta hashes
-- ARGV[1] heartbeats at or before this time (seconds) count as dead
-- ARGV[2] most jobs to move in this call
-- ARGV[3] a worker to leave alone (the caller), may be empty
--
-- Returns { jobs moved, 1 when there may be more to do else 0 }.
local workers, active, inflight_prefix, meta_prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local budget, caller = tonumber(ARGV[2]), ARGV[3]
local page = 100

local moved = 0
local dead = redis.call('ZRANGEBYSCORE', workers, '-inf', ARGV[1], 'LIMIT', 0, page)
local skipped = 0
for _, worker in ipairs(dead) do
    if worker == caller then
        skipped = skipped + 1
    else
        local inflight = inflight_prefix .. ':' .. worker
        while budget > 0 do
            local id = redis.call('SPOP', inflight)
            if not id then
                break
            end
            local meta_key = meta_prefix .. ':' .. id
            redis.call('LPUSH', at_level(active, level_of(meta_key)), id)
            redis.call('HSET', meta_key, 'status', 'Pending')
            redis.call('HDEL', meta_key, 'locked_at', 'locked_by')
            moved = moved + 1
            budget = budget - 1
        end
        if redis.call('EXISTS', inflight) == 0 then
            redis.call('ZREM', workers, worker)
        end
        if budget == 0 then
            return { moved, 1 }
        end
    end
end
if #dead == page and skipped < page then
    return { moved, 1 }
end
return { moved, 0 }
