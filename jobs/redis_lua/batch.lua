-- batch.lua: A batch's limits, spend and running jobs (ID: the batch's id; nil: no such batch). A script so the running
-- count is pruned and read in one step, as claim.lua reads it.
return batch_info(ID, nil) or false
