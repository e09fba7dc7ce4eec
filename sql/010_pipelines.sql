-- Pipeline schedules (seed 003 §3, DT-FM; issue 19; docs/pipelines.md and
-- docs/protocol.md, "Pipeline schedules"): which live peer runs which stage
-- of which pipeline replica of a run whose config has a "pipeline" object.
-- Every assignment the coordinators solved and signed is kept, with the
-- inputs it was solved from, so organizers can see why a peer got its slot
-- and the next solve can start from the previous partition (seed 003 §3.4).
CREATE TABLE pipelines (
    id            bigserial PRIMARY KEY,
    run_id        bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    version       bigint NOT NULL CHECK (version > 0),
    kid           text NOT NULL REFERENCES signing_keys (kid),
    created_at    timestamptz NOT NULL DEFAULT now(),
    valid_from    timestamptz NOT NULL,
    valid_until   timestamptz NOT NULL,
    inputs        jsonb NOT NULL,      -- run parameters, chosen devices' figures, spares
    inputs_sha256 text NOT NULL CHECK (inputs_sha256 ~ '^[0-9a-f]{64}$'),
    result        jsonb NOT NULL,      -- search statistics, partition, random baseline
    solve_ms      double precision NOT NULL CHECK (solve_ms >= 0),
    payload       text NOT NULL,       -- the exact signed JSON (docs/protocol.md)
    signature     bytea NOT NULL CHECK (length(signature) = 64),
    CHECK (valid_until > valid_from),
    UNIQUE (run_id, version)
);
