-- Checkpoints of single experts of a decentralized mixture-of-experts layer
-- (seed 002 §3.3; issue 18; docs/checkpoints.md, "Expert checkpoints"): an
-- expert server uploads each expert it hosts every checkpoint_every_s; a
-- server that takes over an expert whose server left loads the newest. The
-- file is content-addressed on disk (<checkpoint-dir>/<run>/experts/
-- <sha256>.ckpt); the row, written after the file is complete, verified and
-- durable, makes it visible. No averaging round covers an expert, so these
-- are not vouched by reports (docs/architecture.md, "Threat model").
CREATE TABLE expert_checkpoints (
    id            bigserial PRIMARY KEY,
    run_id        bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    uid           text NOT NULL CHECK (length(uid) BETWEEN 3 AND 64),
    step          bigint NOT NULL CHECK (step >= 0),
    sha256        text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    params_sha256 bytea NOT NULL CHECK (length(params_sha256) = 32),
    size_bytes    bigint NOT NULL CHECK (size_bytes > 0),
    uploaded_by   bigint REFERENCES users (id),
    uploaded_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX expert_checkpoints_uid ON expert_checkpoints (run_id, uid, id DESC);
CREATE INDEX expert_checkpoints_uploader ON expert_checkpoints (run_id, uid, uploaded_by, uploaded_at DESC);
