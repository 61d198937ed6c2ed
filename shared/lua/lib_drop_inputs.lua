-- Library, not a script (shared/keys.py prepends it to every script that ends a request: abort.lua, claim.lua,
-- finish.lua, and fail.lua and expire.lua through lib_fail_request.lua): drop a request's input images and give
-- their bytes back to the input budget. ``inputs`` (``P:inputs:bytes``, the script's ``end_keys``) is the bytes of
-- input images held by unfinished requests: submit.lua adds what it stores, in the step that checks the budget
-- (max_queued_input_bytes), and records in the hash what it added (field ``input_bytes``, INPUT_COUNT_FIELD); this
-- takes off that figure and deletes it with the images, so the count stays exact whatever path ends the request, a
-- second call frees nothing, and a request stored before the count existed (no ``input_bytes``: never added) takes
-- nothing off. No other script may delete these fields.
-- counted: the hash's INPUT_COUNT_FIELD as the caller already read it (false when absent), or nil: read it here.
-- none_held: the caller knows the request never held input images (its spec's task needs none): with no count
-- either, there is nothing to delete.
local INPUT_COUNT_FIELD = 'input_bytes'
local function drop_inputs(hash, inputs, counted, none_held)
  if counted == nil then counted = redis.call('HGET', hash, INPUT_COUNT_FIELD) end
  if none_held and not counted then return end
  counted = tonumber(counted or '0')
  redis.call('HDEL', hash, 'input_image', 'input_mask', INPUT_COUNT_FIELD)
  if counted > 0 then redis.call('DECRBY', inputs, counted) end
end
