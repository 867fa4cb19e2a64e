-- Records a worker's heartbeat. Fails when the worker is no longer
-- registered (another worker presumed it dead and took its jobs back): the
-- worker must stop and start again under a new name.
--
-- KEYS[1] workers: zset, worker name -> last heartbeat (seconds)
-- ARGV[1] now (seconds)
-- ARGV[2] worker name
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
    return redis.error_reply('heartbeat: worker ' .. ARGV[2] .. ' is not registered')
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
return 1
