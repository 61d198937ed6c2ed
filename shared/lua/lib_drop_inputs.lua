-- Library, not a script (shared/keys.py prepends it to every script that ends a request: abort.lua, claim.lua,
-- finish.lua, and fail.lua and expire.lua through lib_fail_request.lua): drop a request's input images and give
-- their bytes back to the input budget. ``P:inputs:bytes`` (named from the request hash key, as ``:metrics``) is the
-- bytes of input images held by unfinished requests: submit.lua adds what it stores, in the step that checks the
-- budget (max_queued_input_bytes); this takes off what the hash holds (HSTRLEN), so the count stays exact whatever
-- path ends the request, and a second call frees nothing. No other script may delete these fields.
local function drop_inputs(hash)
  local held = redis.call('HSTRLEN', hash, 'input_image') + redis.call('HSTRLEN', hash, 'input_mask')
  if held > 0 then
    redis.call('HDEL', hash, 'input_image', 'input_mask')
    redis.call('DECRBY', string.match(hash, '^(.*):req:') .. ':inputs:bytes', held)
  end
end
