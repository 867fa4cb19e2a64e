-- The jobs of some queues that have not finished, read at one instant, with
-- the namespace's marker: what the Redis guard needs to move a queue's safe
-- point without asking about every job that did finish.
--
-- A job that has not finished is in exactly one of: the active list or
-- its priority level's (ready), the scheduled set or its level's (due later, retry copies included) or the
-- in-flight set of the worker running it. Every script that moves a job
-- between them (push, fetch, ack, release, recover, rerun) does so in one step,
-- so this reading sees each unfinished job once.
--
-- KEYS[1] the marker hash (field `epoch`)
-- KEYS[2..] per queue four keys: active list, scheduled zset (those of the
--   priority levels are <key>:p2, :p1, :p-1, :p-2), workers zset
--   (worker name -> last heartbeat), prefix of the in-flight sets
--   (<prefix>:<worker>)
-- ARGV[1] most task ids to return
--
-- Returns { epoch ('' without a marker), count, ids }: count is how many
-- unfinished jobs the queues hold, counted before any id is read; ids lists
-- them only when count <= ARGV[1] (else it is empty), so a queue holding a
-- backlog costs O(queues + workers) here, not O(backlog).
local limit = tonumber(ARGV[1])
local epoch = redis.call('HGET', KEYS[1], 'epoch') or ''

-- A key and those of the priority levels (`<key>:p<level>`).
local function levels(key)
    return { key, key .. ':p2', key .. ':p1', key .. ':p-1', key .. ':p-2' }
end

local count = 0
for k = 2, #KEYS, 4 do
    for _, list in ipairs(levels(KEYS[k])) do
        count = count + redis.call('LLEN', list)
    end
    for _, set in ipairs(levels(KEYS[k + 1])) do
        count = count + redis.call('ZCARD', set)
    end
    for _, worker in ipairs(redis.call('ZRANGE', KEYS[k + 2], 0, -1)) do
        count = count + redis.call('SCARD', KEYS[k + 3] .. ':' .. worker)
    end
end

local ids = {}
if count <= limit then
    for k = 2, #KEYS, 4 do
        for _, list in ipairs(levels(KEYS[k])) do
            for _, id in ipairs(redis.call('LRANGE', list, 0, -1)) do
                ids[#ids + 1] = id
            end
        end
        for _, set in ipairs(levels(KEYS[k + 1])) do
            for _, id in ipairs(redis.call('ZRANGE', set, 0, -1)) do
                ids[#ids + 1] = id
            end
        end
        for _, worker in ipairs(redis.call('ZRANGE', KEYS[k + 2], 0, -1)) do
            for _, id in ipairs(redis.call('SMEMBERS', KEYS[k + 3] .. ':' .. worker)) do
                ids[#ids + 1] = id
            end
        end
    end
end

return { epoch, count, ids }
