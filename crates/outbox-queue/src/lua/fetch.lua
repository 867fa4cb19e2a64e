-- Hands the next jobs of a queue to one worker.
--
-- Work per call is O(batch * log n) whatever the backlog: due scheduled jobs
-- are promoted only as far as the batch needs them, with a bounded
-- ZRANGEBYSCORE ... LIMIT, and every id is handled by its own call, so no
-- table is ever unpack()ed (Lua refuses to unpack more than about 8,000
-- values). The job is marked running here, so no later lease step has to
-- find it in the active list.
--
-- KEYS[1] workers: zset, worker name -> last heartbeat (seconds)
-- KEYS[2] active: list of task ids ready to run, oldest first
-- KEYS[3] this worker's in-flight set
-- KEYS[4] bodies: hash, task id -> job body
-- KEYS[5] prefix of the per-job meta hashes (<prefix>:<task id>)
-- KEYS[6] scheduled: zset, task id -> due time (seconds)
-- ARGV[1] now (seconds)
-- ARGV[2] most jobs to hand out
-- ARGV[3] worker name
--
-- Returns { bodies, metas, missing }: metas[i] is { task id, field, value,
-- ... } for bodies[i]; missing lists ids whose body is gone (trimmed or
-- deleted); they are dropped from the queue.
local workers, active, inflight = KEYS[1], KEYS[2], KEYS[3]
local bodies_key, meta_prefix, scheduled = KEYS[4], KEYS[5], KEYS[6]
local now, batch, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3]

if not redis.call('ZSCORE', workers, worker) then
    return redis.error_reply('worker not registered: ' .. worker)
end

local short = batch - redis.call('LLEN', active)
if short > 0 then
    local due = redis.call('ZRANGEBYSCORE', scheduled, '-inf', now, 'LIMIT', 0, short)
    for _, id in ipairs(due) do
        redis.call('ZREM', scheduled, id)
        redis.call('RPUSH', active, id)
    end
end

local bodies, metas, missing = {}, {}, {}
for _ = 1, batch do
    local id = redis.call('LPOP', active)
    if not id then
        break
    end
    local body = redis.call('HGET', bodies_key, id)
    if body then
        redis.call('SADD', inflight, id)
        local meta_key = meta_prefix .. ':' .. id
        redis.call('HSET', meta_key, 'status', 'Running', 'locked_by', worker, 'locked_at', now)
        local meta = redis.call('HGETALL', meta_key)
        table.insert(meta, 1, id)
        bodies[#bodies + 1] = body
        metas[#metas + 1] = meta
    else
        missing[#missing + 1] = id
    end
end

return { bodies, metas, missing }
