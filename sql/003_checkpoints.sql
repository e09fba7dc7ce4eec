-- Checkpoints uploaded by peers (seed 000 §3.3; issue "collaborative
-- training"): the file is content-addressed on disk (<checkpoint-dir>/<run>/
-- <sha256>.ckpt); this row makes it visible. The row is written only after
-- the file is complete, verified and durable, so a partial upload is never
-- visible.
CREATE TABLE checkpoints (
    id          bigserial PRIMARY KEY,
    run_id      bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step        bigint NOT NULL CHECK (step >= 0),
    sha256      text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes  bigint NOT NULL CHECK (size_bytes > 0),
    uploaded_by bigint REFERENCES users (id),
    uploaded_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_id, step)
);
CREATE INDEX checkpoints_run_step ON checkpoints (run_id, step DESC);
