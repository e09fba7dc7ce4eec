-- ALBERT's heads in the contribution reports (issue 20; docs/accounting.md,
-- "Reports" and "Learning curve and health"). A report of a language-model
-- run may carry `sop_loss` (the round's sentence-order loss mean) and
-- `mlm_accuracy` (the share of its masked positions whose argmax prediction
-- was the target); reports without them (MLP, GPT, agents before them) keep
-- NULL. Nullable columns without a default: adding them rewrites nothing,
-- so this applies at once to a database of any size.

ALTER TABLE contrib_reports
    ADD COLUMN sop_loss double precision CHECK (sop_loss >= 0 AND sop_loss <= 1e6),
    ADD COLUMN mlm_accuracy double precision CHECK (mlm_accuracy >= 0 AND mlm_accuracy <= 1);

-- contrib_claims as in 011, with the two heads at the end.
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
       c.params_sha256, c.experts, c.sop_loss, c.mlm_accuracy
  FROM contrib_reports c
  JOIN runs r ON r.id = c.run_id
  JOIN users u ON u.id = c.user_id
  LEFT JOIN contrib_seen s ON s.run_id = c.run_id AND s.step = c.step
                          AND s.subject = c.peer_public_key AND s.round_id = c.round_id
  LEFT JOIN (SELECT DISTINCT run_id, step, subject FROM contrib_exclusions) x
         ON x.run_id = c.run_id AND x.step = c.step AND x.subject = c.peer_public_key;

-- contrib_curve as in 005 (claimed samples, for psql), with the heads'
-- samples-weighted means at the end (NULL for a step without them).
CREATE OR REPLACE VIEW contrib_curve AS
SELECT r.name AS run, c.step,
       sum(c.loss * c.samples) FILTER (WHERE c.samples > 0 AND c.loss IS NOT NULL)
         / nullif(sum(c.samples) FILTER (WHERE c.samples > 0 AND c.loss IS NOT NULL), 0) AS loss,
       sum(c.samples) AS samples, count(*) AS peers, min(c.received_at) AS t,
       sum(c.sop_loss * c.samples) FILTER (WHERE c.samples > 0 AND c.sop_loss IS NOT NULL)
         / nullif(sum(c.samples) FILTER (WHERE c.samples > 0 AND c.sop_loss IS NOT NULL), 0)
         AS sop_loss,
       sum(c.mlm_accuracy * c.samples) FILTER (WHERE c.samples > 0 AND c.mlm_accuracy IS NOT NULL)
         / nullif(sum(c.samples) FILTER (WHERE c.samples > 0 AND c.mlm_accuracy IS NOT NULL), 0)
         AS mlm_accuracy
  FROM contrib_reports c JOIN runs r ON r.id = c.run_id
 GROUP BY r.name, c.step;
