-- The flag says where the API a lease talked to lived (in its host's own
-- process, so its sandboxes are gone with that process), not what it was.

ALTER TABLE leases RENAME COLUMN embedded_sim TO api_in_process;
