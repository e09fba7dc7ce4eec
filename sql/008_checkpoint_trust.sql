-- Checkpoints are trusted only when the collaboration vouches for them
-- (issue 22; docs/checkpoints.md, "Trust"). An upload records the SHA-256 of
-- its parameter section; a contribution report carries the SHA-256 of the
-- reporter's parameters after the round (docs/accounting.md). A checkpoint of
-- step s is vouched when most verified members of step s - 1 that attest a
-- hash attest its hash, or when an organizer uploaded it; only vouched
-- checkpoints are served as `latest`, count for retention, or move the
-- report step window.

-- Several candidates may wait for their vouchers at one step (a forged
-- upload must not lock the honest one out), but each uploader gets one.
ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_run_id_step_key;
ALTER TABLE checkpoints
    ADD COLUMN params_sha256 bytea CHECK (length(params_sha256) = 32),
    ADD COLUMN trusted boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT checkpoints_run_step_sha UNIQUE (run_id, step, sha256),
    ADD CONSTRAINT checkpoints_run_step_uploader UNIQUE (run_id, step, uploaded_by);

ALTER TABLE contrib_reports
    ADD COLUMN params_sha256 bytea CHECK (length(params_sha256) = 32);

-- contrib_claims as in 005, with the attested parameter hash at the end.
CREATE OR REPLACE VIEW contrib_claims AS
SELECT c.id, r.name AS run, c.run_id, c.step, u.username, c.user_id, c.peer_public_key,
       c.round_id, c.group_id, c.samples AS claimed_samples,
       s.seen_min, s.seen_max, coalesce(s.observers, 0) AS observers,
       (x.subject IS NOT NULL) AS excluded,
       CASE WHEN s.observers > 0 AND x.subject IS NULL
                 AND c.samples <= s.seen_max * (1 + 1e-9) + 1e-9
            THEN least(c.samples, s.seen_min) ELSE 0 END AS verified_samples,
       coalesce(c.samples > s.seen_max * (1 + 1e-9) + 1e-9, false) AS inflated,
       c.compute_s, c.loss, c.sps, c.round_ms, c.parts, c.parts_averaged, c.received_at,
       c.params_sha256
  FROM contrib_reports c
  JOIN runs r ON r.id = c.run_id
  JOIN users u ON u.id = c.user_id
  LEFT JOIN contrib_seen s ON s.run_id = c.run_id AND s.step = c.step
                          AND s.subject = c.peer_public_key AND s.round_id = c.round_id
  LEFT JOIN (SELECT DISTINCT run_id, step, subject FROM contrib_exclusions) x
         ON x.run_id = c.run_id AND x.step = c.step AND x.subject = c.peer_public_key;

-- Per checkpoint: the verified members of the step that produced it (its
-- step - 1) that attest a parameter hash, how many of them attest its hash,
-- and whether it is vouched. Computed on read, like verification: a late
-- report vouches at once.
CREATE VIEW checkpoint_trust AS
SELECT k.id, k.run_id, k.step, k.sha256, k.size_bytes, k.uploaded_by, k.uploaded_at, k.trusted,
       coalesce(a.vouchers, 0) AS vouchers, coalesce(a.attesting, 0) AS attesting,
       (k.trusted OR coalesce(a.vouchers * 2 > a.attesting, false)) AS vouched
  FROM checkpoints k
  LEFT JOIN LATERAL (
       SELECT count(*) FILTER (WHERE c.params_sha256 = k.params_sha256) AS vouchers,
              count(*) AS attesting
         FROM contrib_claims c
        WHERE c.run_id = k.run_id AND c.step = k.step - 1 AND c.params_sha256 IS NOT NULL
          AND c.observers > 0 AND NOT c.inflated AND NOT c.excluded) a ON true;
