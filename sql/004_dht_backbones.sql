-- The DHT backbone nodes the coordinators run, one per open run per
-- coordinator (seed 000 §3.3: peers bootstrap from stable backbone peers).
-- Each coordinator refreshes its rows; passes hand out the fresh ones.
CREATE TABLE dht_backbones (
    run_id     bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    kid        text NOT NULL REFERENCES signing_keys (kid),
    address    text NOT NULL,
    public_key bytea NOT NULL CHECK (length(public_key) = 32),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, kid)
);
