-- Hands the next jobs of a queue to one worker, the highest priority
-- first: level 2, level 1, the normal jobs, level -1, level -2. Each level
-- has a ready list and a scheduled set: apalis' active list and scheduled
-- set for the normal level, `<active>:p<level>` and `<scheduled>:p<level>`
-- for the others (push_level.lua). A level's due scheduled jobs join its
-- ready list as far as the batch needs them, then the list is taken from.
--
-- Work per call is O(batch * log n) whatever the backlog: due scheduled jobs
-- are promoted only as far as the batch needs them, with a bounded
-- ZRANGEBYSCORE ... LIMIT, and every id is handled by its own call, so no
-- table is ever unpack()ed (Lua refuses to unpack more than about 8,000
-- values). An empty level costs one LLEN and one ZRANGEBYSCORE. The job is
-- marked running here, so no later lease step has to find it in a list.
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

local bodies, metas, missing = {}, {}, {}

local function left()
    return batch - #bodies - #missing
end

-- Moves the due jobs of the scheduled set `from` onto ready lists, as far
-- as `list` lacks for the rest of the batch. A job in the normal set goes
-- to the list of the level its meta hash records (a job pushed with
-- apalis' own script may carry one), one in a level's set to that level's.
local function promote(from, list, by_meta)
    local short = left() - redis.call('LLEN', list)
    if short <= 0 then
        return
    end
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', from, '-inf', now, 'LIMIT', 0, short)) do
        redis.call('ZREM', from, id)
        local to = list
        if by_meta then
            to = at_level(active, level_of(meta_prefix .. ':' .. id))
        end
        redis.call('RPUSH', to, id)
    end
end

-- Moves up to the rest of the batch from `list` to this worker.
local function take(list)
    for _ = 1, left() do
        local id = redis.call('LPOP', list)
        if not id then
            return
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
end

for _, level in ipairs({ '2', '1', '0', '-1', '-2' }) do
    if left() <= 0 then
        break
    end
    local list = at_level(active, level)
    promote(at_level(scheduled, level), list, level == '0')
    take(list)
end

return { bodies, metas, missing }
