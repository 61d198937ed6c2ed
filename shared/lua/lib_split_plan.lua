-- Library, not a script (shared/keys.py prepends it to claim.lua): which requests of a batch a claim runs once runs
-- of the batch were lost (their worker died: a crash, the OOM killer, the hard time limit; or it lost Redis). Pure
-- (no redis.call), so it is unit-tested on its own (tests/unit/test_split_plan.py).
--
-- A lost run cannot be caught in the process that died, so the batch is bisected across claims, its state in the
-- batch hash (two counts per request): a lost run of several requests is split in halves, the first (larger) one
-- run by this claim and the second put aside, as the executor halves a forward that runs out of memory; a lost run
-- of one request is run again alone until it was lost max_lost times running alone, then it fails (WorkerLost). So
-- only the request whose run kills its worker fails, and its peers succeed. Only losses of a request running alone
-- count towards failing it: a loss that is not its fault (a deploy restart, an OOM of the host) splits the run it
-- hits, but fails a request only if it hits it alone, and max_lost of those are needed.
--
-- rows: the batch's unfinished, unaborted requests, in batch order, each {lost = <bool>, count = <int>,
-- alone = <int>}:
--   lost: it was running under the batch's last claim, which ended without finishing it;
--   count: the lost runs of it in this batch before that one (they order the parts: see below);
--   alone: those of them that ran it alone.
-- max_lost: max_batch_attempts.
-- ran: how many requests the last claim that ran something ran (nil: unknown, then a lone lost row ran alone).
-- Returns {run = {i, ...}, fail = {i, ...}, counts = {[i] = n, ...}, alone = {[i] = n, ...}}: the rows this claim
-- runs, the row it fails WorkerLost, the new count of each lost row and the new alone count of a lost row that ran
-- alone. A lost row that is neither run nor failed is put aside.
--
-- With no lost row (the first claim, or the last run finished its part), the claim runs the waiting rows with the
-- highest count. That is the whole batch the first time and, after a split, the half put aside last: the count of
-- the part running is never below any waiting one's and rises with each loss, so the halves run depth first, each
-- half of a lost part right after the other, and a part is never merged with another.
--
-- Bound: every lost run of a part of several halves it (the lost rows of a run that finished some rows, too), so a
-- request is lost at most ceil(log2 N) times with others, then at most max_lost times alone: a request whose run
-- always kills its worker fails after at most ceil(log2 N) + max_lost lost runs, whatever else was lost.
local function split_plan(rows, max_lost, ran)
  local plan = {run = {}, fail = {}, counts = {}, alone = {}}
  local lost = {}
  for i, row in ipairs(rows) do
    if row.lost then
      plan.counts[i] = row.count + 1
      table.insert(lost, i)
    end
  end
  if #lost == 1 and (ran or 1) == 1 then
    local i = lost[1]
    plan.alone[i] = rows[i].alone + 1
    if plan.alone[i] >= max_lost then
      table.insert(plan.fail, i)
      lost = {}
    end
  end
  if #lost > 0 then
    for k = 1, math.ceil(#lost / 2) do table.insert(plan.run, lost[k]) end
    return plan
  end
  local top = nil
  for _, row in ipairs(rows) do
    if not row.lost and (top == nil or row.count > top) then top = row.count end
  end
  for i, row in ipairs(rows) do
    if not row.lost and row.count == top then table.insert(plan.run, i) end
  end
  return plan
end
