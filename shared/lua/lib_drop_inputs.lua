-- Library, not a script (shared/keys.py prepends it to every script that ends a request: abort.lua, claim.lua,
-- finish.lua, and fail.lua and expire.lua through lib_fail_request.lua): drop a request's input images and give
-- their bytes back to the input budget. ``inputs`` (``P:inputs:bytes``, the script's ``end_keys``) is the bytes of
-- input images held by unfinished requests: submit.lua adds what it stores, in the step that checks the budget
-- (max_queued_input_bytes), and records in the hash what it added (field ``input_bytes``); this takes off that
-- figure and deletes it with the images, so the count stays exact whatever path ends the request, a second call
-- frees nothing, and a request stored before the count existed (no ``input_bytes``: never added) takes nothing off.
-- No other script may delete these fields.
local function drop_inputs(hash, inputs)
  local counted = tonumber(redis.call('HGET', hash, 'input_bytes') or '0')
  redis.call('HDEL', hash, 'input_image', 'input_mask', 'input_bytes')
  if counted > 0 then redis.call('DECRBY', inputs, counted) end
end
