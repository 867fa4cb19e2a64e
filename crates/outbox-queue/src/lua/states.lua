-- Where each of a list of jobs stands, following its retry copies.
--
-- KEYS[1] bodies: hash, task id -> job body
-- KEYS[2] done set
-- KEYS[3] dead set
-- KEYS[4] prefix of the per-job meta hashes (<prefix>:<task id>)
-- ARGV[1] most retry rounds (<task id>~retry1 .. ~retry<n>)
-- ARGV[2..] task ids (first deliveries)
--
-- Returns, per task id, { state, latest copy, done_at }: state 0 missing
-- (no body), 1 waiting or running, 2 done, 3 dead; the latest copy is the
-- task id of the last copy of the job that exists (a job whose handler
-- asked for a later retry is finished and has a copy `~retry<n>` due
-- later); done_at is that copy's finishing time in seconds ('' if none).
-- Per id at most rounds + 1 steps, so a call is bounded by its list.
local bodies, done, dead, meta_prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rounds = tonumber(ARGV[1])

local out = {}
for i = 2, #ARGV do
    local id = ARGV[i]
    local state, latest = 0, id
    if redis.call('HEXISTS', bodies, id) == 1 then
        local round = 0
        while true do
            if redis.call('SISMEMBER', done, latest) == 1 then
                local nxt = id .. '~retry' .. (round + 1)
                if round < rounds and redis.call('HEXISTS', bodies, nxt) == 1 then
                    round = round + 1
                    latest = nxt
                else
                    state = 2
                    break
                end
            elseif redis.call('SISMEMBER', dead, latest) == 1 then
                state = 3
                break
            else
                state = 1
                break
            end
        end
    end
    local done_at = ''
    if state >= 2 then
        done_at = redis.call('HGET', meta_prefix .. ':' .. latest, 'done_at') or ''
    end
    out[#out + 1] = { state, latest, done_at }
end
return out
