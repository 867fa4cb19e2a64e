-- The jobs of some queues that have not finished, read at one instant, with
-- the namespace's marker: what the Redis guard needs to move a queue's safe
-- point without asking about every job that did finish.
--
-- A job that has not finished is in exactly one of: the active list
-- (ready), the scheduled set (due later, retry copies included) or the
-- in-flight set of the worker running it. Every script that moves a job
-- between them (push, fetch, ack, release, recover, rerun) does so in one step,
-- so this reading sees each unfinished job once.
--
-- KEYS[1] the marker hash (field `epoch`)
-- KEYS[2..] per queue four keys: active list, scheduled zset, workers zset
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

local count = 0
for k = 2, #KEYS, 4 do
    count = count + redis.call('LLEN', KEYS[k]) + redis.call('ZCARD', KEYS[k + 1])
    for _, worker in ipairs(redis.call('ZRANGE', KEYS[k + 2], 0, -1)) do
        count = count + redis.call('SCARD', KEYS[k + 3] .. ':' .. worker)
    end
end

local ids = {}
if count <= limit then
    for k = 2, #KEYS, 4 do
        for _, id in ipairs(redis.call('LRANGE', KEYS[k], 0, -1)) do
            ids[#ids + 1] = id
        end
        for _, id in ipairs(redis.call('ZRANGE', KEYS[k + 1], 0, -1)) do
            ids[#ids + 1] = id
        end
        for _, worker in ipairs(redis.call('ZRANGE', KEYS[k + 2], 0, -1)) do
            for _, id in ipairs(redis.call('SMEMBERS', KEYS[k + 3] .. ':' .. worker)) do
                ids[#ids + 1] = id
            end
        end
    end
end

return { epoch, count, ids }
