-- Runs finished (done or dead) jobs again: each id in the given set is
-- taken out of it, its meta record is reset to a pending job with no
-- attempts, and it is scheduled due now, with its body unchanged. Ids not
-- in the set (waiting, running, finished otherwise, or gone) are left alone.
--
-- KEYS[1] bodies: hash, task id -> job body
-- KEYS[2] the set the jobs finished in: done or dead
-- KEYS[3] scheduled: zset, task id -> due time (seconds) (a priority
--   level's is KEYS[3] .. ':p' .. level)
-- KEYS[4] prefix of the per-job meta hashes
-- ARGV[1] now (seconds)
-- ARGV[2..] task ids
--
-- Returns the ids of the jobs put back.
local bodies, finished, scheduled, meta_prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = ARGV[1]

local moved = {}
for i = 2, #ARGV do
    local id = ARGV[i]
    if redis.call('HEXISTS', bodies, id) == 1 and redis.call('SREM', finished, id) == 1 then
        local meta = meta_prefix .. ':' .. id
        redis.call('HDEL', meta, 'done_at', 'result', 'locked_by', 'locked_at')
        redis.call('HSET', meta, 'status', 'Pending', 'attempts', 0)
        redis.call('ZADD', at_level(scheduled, level_of(meta)), now, id)
        moved[#moved + 1] = id
    end
end
return moved
