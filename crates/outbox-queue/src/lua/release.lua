-- Hands jobs a stopping worker fetched but never started back to the front
-- of the list of their level (the meta hash's `priority`; none is the
-- active list), in their order. O(1) per job.
--
-- KEYS[1] this worker's in-flight set
-- KEYS[2] active list (a level's list is KEYS[2] .. ':p' .. level)
-- KEYS[3] prefix of the per-job meta hashes
-- ARGV[1..] the task ids, in queue order
--
-- Returns how many were handed back.
local inflight, active, meta_prefix = KEYS[1], KEYS[2], KEYS[3]
local released = 0
for i = #ARGV, 1, -1 do
    local id = ARGV[i]
    if redis.call('SREM', inflight, id) == 1 then
        local meta_key = meta_prefix .. ':' .. id
        redis.call('LPUSH', at_level(active, level_of(meta_key)), id)
        redis.call('HSET', meta_key, 'status', 'Pending')
        redis.call('HDEL', meta_key, 'locked_at', 'locked_by')
        released = released + 1
    end
end
return released
