-- A stopping worker leaves the workers set, unless it still holds jobs: then
-- it stays, and the jobs come back once its heartbeat is old enough.
--
-- KEYS[1] workers: zset, worker name -> last heartbeat (seconds)
-- KEYS[2] this worker's in-flight set
-- KEYS[3] this worker's metadata hash
-- ARGV[1] worker name
--
-- Returns 1 when the worker left, 0 when it stays.
if redis.call('SCARD', KEYS[2]) > 0 then
    return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[3])
return 1
