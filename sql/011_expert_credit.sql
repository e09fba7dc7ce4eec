-- Credit for expert servers (issue 18; seed 002_2b00836ea4b30f79.txt §3.3;
-- docs/accounting.md, "Expert servers"). Servers send no reports: the
-- trainers they served attest for them. A trainer's report may carry
-- `experts` (server key -> samples it answered for this trainer since the
-- trainer's previous report); the coordinator stores it here, keyed by hex,
-- and credits it on read:
--   * only attestations of VERIFIED trainer reports count (contrib_claims:
--     observers >= 1, not inflated, not excluded);
--   * an attestation naming a key that holds no pass in the run, or the
--     reporter itself, is ignored (and flagged);
--   * the rest of one report is capped: their sum at most k x the report's
--     verified samples (k: the run's experts per sample, model.k of a dmoe
--     run, 1 when absent; 0 for any other model), scaled down
--     proportionally when over; what the cap removed is "clipped" (flagged).
-- (010 is another branch's migration; versions need not be contiguous.)

ALTER TABLE contrib_reports ADD COLUMN experts jsonb
    CHECK (experts IS NULL OR jsonb_typeof(experts) = 'object');

-- contrib_claims as in 008, with the report's attestations at the end.
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
       c.params_sha256, c.experts
  FROM contrib_reports c
  JOIN runs r ON r.id = c.run_id
  JOIN users u ON u.id = c.user_id
  LEFT JOIN contrib_seen s ON s.run_id = c.run_id AND s.step = c.step
                          AND s.subject = c.peer_public_key AND s.round_id = c.round_id
  LEFT JOIN (SELECT DISTINCT run_id, step, subject FROM contrib_exclusions) x
         ON x.run_id = c.run_id AND x.step = c.step AND x.subject = c.peer_public_key;

-- The experts per sample a run's trainers call (0: not a dmoe run, so no
-- expert credit at all).
CREATE FUNCTION run_experts_per_sample(config jsonb) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN config->'model'->>'type' IS DISTINCT FROM 'dmoe' THEN 0
              WHEN jsonb_typeof(config->'model'->'k') = 'number' THEN (config->'model'->>'k')::float8
              ELSE 1 END
$$;

-- One row per attestation: what it claims, whether it counts, and what it
-- credits after the report's cap.
CREATE VIEW contrib_expert_attestations AS
WITH a AS (
  SELECT c.id AS report_id, c.run, c.run_id, c.step, c.username AS trainer_username,
         c.peer_public_key AS trainer, decode(e.key, 'hex') AS server,
         (e.value #>> '{}')::float8 AS attested, c.received_at,
         (c.observers > 0 AND NOT c.inflated AND NOT c.excluded) AS report_verified,
         c.verified_samples * run_experts_per_sample(r.config) AS cap
    FROM contrib_claims c
    JOIN runs r ON r.id = c.run_id
    CROSS JOIN LATERAL jsonb_each(c.experts) e
   WHERE c.experts IS NOT NULL),
k AS (
  SELECT a.*, (a.server <> a.trainer AND EXISTS (
            SELECT 1 FROM passes p WHERE p.run_id = a.run_id AND p.peer_public_key = a.server))
           AS known
    FROM a),
s AS (
  -- The window is per report; the report's run, step, time and trainer are
  -- in the partition too (they do not change it) so that a filter on them
  -- reaches the scan: PostgreSQL pushes quals below a window only when they
  -- name partitioning columns.
  SELECT k.*, sum(k.attested) FILTER (WHERE k.known)
                OVER (PARTITION BY k.run, k.run_id, k.step, k.received_at, k.trainer, k.report_id)
                AS report_sum
    FROM k)
SELECT report_id, run, run_id, step, trainer_username, trainer, server, attested, received_at,
       report_verified, known, cap, report_sum,
       (report_verified AND known AND report_sum > cap * (1 + 1e-9) + 1e-9) AS clipped_report,
       CASE WHEN NOT (report_verified AND known) THEN 0
            WHEN report_sum > cap * (1 + 1e-9) + 1e-9 THEN attested * cap / report_sum
            ELSE attested END AS credited,
       CASE WHEN report_verified AND known AND report_sum > cap * (1 + 1e-9) + 1e-9
            THEN attested - attested * cap / report_sum ELSE 0 END AS clipped
  FROM s;

-- Per run and server key: its owner (the newest pass for the key in the
-- run), verified expert samples, what the caps clipped, and from how many
-- trainer reports.
CREATE VIEW contrib_expert_totals AS
SELECT a.run, a.run_id, a.server AS peer_public_key,
       (SELECT u.username FROM passes p JOIN users u ON u.id = p.user_id
         WHERE p.run_id = a.run_id AND p.peer_public_key = a.server
         ORDER BY p.id DESC LIMIT 1) AS username,
       sum(a.credited) AS expert_samples, sum(a.clipped) AS expert_samples_clipped,
       count(*) FILTER (WHERE a.credited > 0) AS attestations,
       min(a.received_at) AS first_at, max(a.received_at) AS last_at
  FROM contrib_expert_attestations a
 WHERE a.known
 GROUP BY a.run, a.run_id, a.server;

CREATE VIEW contrib_expert_user_totals AS
SELECT run, run_id, username, count(*) AS servers, sum(expert_samples) AS expert_samples,
       sum(expert_samples_clipped) AS expert_samples_clipped, min(first_at) AS first_at,
       max(last_at) AS last_at
  FROM contrib_expert_totals GROUP BY run, run_id, username;
