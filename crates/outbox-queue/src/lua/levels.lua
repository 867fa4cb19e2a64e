-- Prepended to every script that puts a job onto a queue's keys (see
-- levels.rs): the keys of a priority level. A level is a job's meta field
-- `priority` as HGET returns it; absent (false) or '0' is the normal
-- level, whose keys are apalis' own; level n's are `<key>:p<n>`.
local function at_level(key, level)
    if not level or level == '0' then
        return key
    end
    return key .. ':p' .. level
end

-- The level the job's meta hash records.
local function level_of(meta_key)
    return redis.call('HGET', meta_key, 'priority')
end

