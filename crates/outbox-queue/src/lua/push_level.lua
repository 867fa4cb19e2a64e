-- Pushes jobs of one priority level other than normal (normal jobs go
-- through apalis-redis' own push script). The same records as apalis'
-- push: the body in the bodies hash (HSETNX, so a task id already there
-- is a duplicate and nothing is written), a meta hash with the attempt
-- counters and status, plus the field `priority` that keeps the level for
-- every script that puts the job back. A job due now goes to its level's
-- list (`<active>:p<level>`), which fetch.lua reads before (positive
-- levels) or after (negative levels) the normal path; a job due later goes
-- to its level's scheduled set (`<scheduled>:p<level>`), from which
-- fetch.lua moves it to the level's list once due, ahead of every normal
-- job. O(1) per job.
--
-- KEYS[1] bodies: hash, task id -> job body
-- KEYS[2] active list (the level's list is KEYS[2] .. ':p' .. level)
-- KEYS[3] prefix of the per-job meta hashes (<prefix>:<task id>)
-- KEYS[4] scheduled: zset, task id -> due time (seconds) (the level's is
--   KEYS[4] .. ':p' .. level)
-- KEYS[5] apalis' signal list
-- ARGV[1] the level: -2, -1, 1 or 2
-- ARGV[2] attempts after which a failing job goes to the dead set
-- ARGV[3..] per job: task id, body, due time in seconds (0 for now)
--
-- Returns how many jobs were new.
local bodies, active, meta_prefix, scheduled, signal = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local level, max_attempts = ARGV[1], ARGV[2]
local list, later = at_level(active, level), at_level(scheduled, level)

local new = 0
for i = 3, #ARGV, 3 do
    local id, body, due = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    if redis.call('HSETNX', bodies, id, body) == 1 then
        redis.call('HSET', meta_prefix .. ':' .. id, 'attempts', 0, 'max_attempts', max_attempts,
            'status', 'Pending', 'idempotency_key', '', 'priority', level)
        if due > 0 then
            redis.call('ZADD', later, due, id)
        else
            redis.call('RPUSH', list, id)
        end
        new = new + 1
    end
end
if new > 0 then
    redis.call('DEL', signal)
    redis.call('LPUSH', signal, 1)
end
return new
