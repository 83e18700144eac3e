-- The fleet's lease ledger: hosts that renew a heartbeat, and the leases
-- they own. Times are the database's own clock (now()), so the hosts'
-- clocks never have to agree.

CREATE TABLE hosts (
    host_id      TEXT PRIMARY KEY,
    hostname     TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Until when the host counts as alive; renewed every third of its expiry.
    expires_at   TIMESTAMPTZ NOT NULL
);

CREATE TABLE leases (
    id                BIGSERIAL PRIMARY KEY,
    owner             TEXT NOT NULL,
    run_id            TEXT NOT NULL,
    state             TEXT NOT NULL,
    provider_lease_id TEXT,
    metadata_json     TEXT,
    driver_key        TEXT NOT NULL,
    company_id        TEXT NOT NULL,
    environment_id    TEXT NOT NULL,
    config_json       TEXT NOT NULL,
    embedded_sim      BOOLEAN NOT NULL,
    last_hook         TEXT NOT NULL,
    last_error_json   TEXT,
    -- The host that owns the row; only it writes the row, until a survivor
    -- takes the row over after the host's heartbeat expired.
    host_id           TEXT NOT NULL,
    pid               INTEGER NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX leases_state ON leases (state);
CREATE INDEX leases_provider_lease_id ON leases (provider_lease_id);
CREATE INDEX leases_host_id ON leases (host_id);
