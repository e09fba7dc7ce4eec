-- Adaptive-averaging schedules (seed 000 §3.2, Appendix B and C; issue 7):
-- what peers report about themselves, and every schedule the coordinators
-- solved and signed, with the inputs it was solved from, so organizers can
-- see why a peer got its role. See docs/schedules.md.

-- The newest capability report of each peer (identified by its pass's
-- public key) in a run. A report is live until expires_at; a peer that
-- stops reporting has left. first_reported_at restarts when a peer comes
-- back after its report expired, which lets the coordinator estimate how
-- often peers leave (the failure rate of Appendix C).
CREATE TABLE capabilities (
    run_id            bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    peer_public_key   bytea NOT NULL CHECK (length(peer_public_key) = 32),
    user_id           bigint NOT NULL REFERENCES users (id),
    pass_id           bigint NOT NULL REFERENCES passes (id),
    report            jsonb NOT NULL,   -- the validated report, as the solver reads it
    first_reported_at timestamptz NOT NULL DEFAULT now(),
    reported_at       timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    CHECK (expires_at > reported_at),
    PRIMARY KEY (run_id, peer_public_key)
);
CREATE INDEX capabilities_live ON capabilities (run_id, expires_at);

-- Departures: a peer whose report expired and who came back (or not) is
-- recorded when the next solve notices, for the failure-rate estimate.
CREATE TABLE capability_departures (
    run_id          bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    peer_public_key bytea NOT NULL CHECK (length(peer_public_key) = 32),
    joined_at       timestamptz NOT NULL,
    left_at         timestamptz NOT NULL,
    PRIMARY KEY (run_id, peer_public_key, left_at)
);
CREATE INDEX capability_departures_run ON capability_departures (run_id, left_at);

-- Every schedule signed, newest version per run served.
CREATE TABLE schedules (
    id            bigserial PRIMARY KEY,
    run_id        bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    version       bigint NOT NULL CHECK (version > 0),
    kid           text NOT NULL REFERENCES signing_keys (kid),
    created_at    timestamptz NOT NULL DEFAULT now(),
    valid_from    timestamptz NOT NULL,
    valid_until   timestamptz NOT NULL,
    inputs        jsonb NOT NULL,      -- peers' reports, run parameters, failure estimate
    inputs_sha256 text NOT NULL CHECK (inputs_sha256 ~ '^[0-9a-f]{64}$'),
    result        jsonb NOT NULL,      -- per-peer LP values, rates, roles, group size
    solve_ms      double precision NOT NULL CHECK (solve_ms >= 0),
    payload       text NOT NULL,       -- the exact signed JSON (docs/protocol.md, Schedules)
    signature     bytea NOT NULL CHECK (length(signature) = 64),
    CHECK (valid_until > valid_from),
    UNIQUE (run_id, version)
);
