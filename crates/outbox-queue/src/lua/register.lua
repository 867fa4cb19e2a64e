-- Registers a worker; refuses a name whose heartbeat is still fresh (two
-- live workers under one name would share an in-flight set).
--
-- KEYS[1] workers: zset, worker name -> last heartbeat (seconds)
-- KEYS[2] this worker's metadata hash
-- ARGV[1] now (seconds)
-- ARGV[2] worker name
-- ARGV[3] seconds a heartbeat stays fresh
-- ARGV[4] the service the worker runs
local now, worker, fresh = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local seen = redis.call('ZSCORE', KEYS[1], worker)
if seen and now - tonumber(seen) < fresh then
    return redis.error_reply('worker ' .. worker .. ' is still alive')
end
redis.call('ZADD', KEYS[1], now, worker)
redis.call('HSET', KEYS[2], 'backend_name', 'RedisStorage', 'service', ARGV[4])
return 1
