-- Records the outcome of finished jobs: done, rescheduled or dead.
-- O(1) per job.
--
-- KEYS[1] this worker's in-flight set
-- KEYS[2] done set
-- KEYS[3] dead set
-- KEYS[4] scheduled: zset, task id -> due time (seconds) (a priority
--   level's is KEYS[4] .. ':p' .. level)
-- KEYS[5] prefix of the per-job meta hashes
-- ARGV[1] now (seconds)
-- ARGV[2] attempts after which a failing job goes to the dead set
-- ARGV[3..] per job: task id, status, attempt, result (JSON)
--
-- A job this worker no longer holds (another worker presumed it dead and
-- put it back on the queue) is left alone: it runs again there. Returns the
-- ids of such jobs.
local inflight, done, dead, scheduled, meta_prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, max_attempts = tonumber(ARGV[1]), tonumber(ARGV[2])

local stale = {}
for i = 3, #ARGV, 4 do
    local id, status, attempt, result = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]) or 0, ARGV[i + 3]
    if redis.call('SREM', inflight, id) == 0 then
        stale[#stale + 1] = id
    else
        if status == 'Done' then
            redis.call('SADD', done, id)
        elseif (status == 'Failed' or status == 'Pending') and attempt < max_attempts then
            local later = at_level(scheduled, level_of(meta_prefix .. ':' .. id))
            redis.call('ZADD', later, now + attempt, id)
        else
            redis.call('SADD', dead, id)
        end
        redis.call('HSET', meta_prefix .. ':' .. id,
            'result', result, 'status', status, 'attempts', attempt, 'done_at', now)
    end
end
return stale
