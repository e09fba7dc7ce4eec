-- Contribution accounting (seed 000_02cc6b5d62a616fc.txt §4.3, Appendix H.1
-- and H.4; issue 6). Agents report each averaging round, signed with their
-- peer key; claims are verified by what the other members of the same round
-- saw. docs/accounting.md gives the rule, the endpoints and these views.

-- One row per accepted report: (run, step, peer) is unique, so a retry is
-- never counted twice. payload and signature are kept as evidence: anyone can
-- re-verify a row (docs/protocol.md, "Contribution reports").
CREATE TABLE contrib_reports (
    id              bigserial PRIMARY KEY,
    run_id          bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step            bigint NOT NULL CHECK (step >= 0),
    peer_public_key bytea NOT NULL CHECK (length(peer_public_key) = 32),
    user_id         bigint NOT NULL REFERENCES users (id),
    pass_id         bigint NOT NULL REFERENCES passes (id),
    round_id        bytea NOT NULL CHECK (length(round_id) = 32),
    group_id        text NOT NULL CHECK (group_id ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    samples         double precision NOT NULL CHECK (samples >= 0 AND samples <= 1e9),
    compute_s       double precision NOT NULL CHECK (compute_s >= 0 AND compute_s <= 86400),
    loss            double precision CHECK (loss >= 0 AND loss <= 1e6),
    sps             double precision NOT NULL CHECK (sps >= 0 AND sps <= 1e9),
    round_ms        double precision NOT NULL CHECK (round_ms >= 0 AND round_ms <= 3.6e6),
    parts           integer NOT NULL CHECK (parts >= 0 AND parts <= 4096),
    parts_averaged  integer NOT NULL CHECK (parts_averaged >= 0 AND parts_averaged <= parts),
    n_members       integer NOT NULL CHECK (n_members >= 0 AND n_members <= 64),
    n_excluded      integer NOT NULL CHECK (n_excluded >= 0 AND n_excluded <= 64),
    payload         text NOT NULL,
    signature       bytea NOT NULL CHECK (length(signature) = 64),
    payload_sha256  bytea NOT NULL CHECK (length(payload_sha256) = 32),
    received_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_id, step, peer_public_key)
);
CREATE INDEX contrib_reports_run_time ON contrib_reports (run_id, received_at);
CREATE INDEX contrib_reports_user ON contrib_reports (user_id, run_id);

-- What the other members of a round saw of a subject: one row per (run, step,
-- round, subject), folded in as reports arrive (min, max, how many saw it).
-- The observer's own entry for itself is never folded in.
CREATE TABLE contrib_seen (
    run_id    bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step      bigint NOT NULL CHECK (step >= 0),
    round_id  bytea NOT NULL CHECK (length(round_id) = 32),
    subject   bytea NOT NULL CHECK (length(subject) = 32),
    seen_min  double precision NOT NULL CHECK (seen_min >= 0),
    seen_max  double precision NOT NULL CHECK (seen_max >= seen_min),
    observers integer NOT NULL CHECK (observers > 0),
    PRIMARY KEY (run_id, step, subject, round_id)
);

-- Members excluded from a round for bad data (non-finite or oversized
-- gradients), as each reporter said: issue 5, "Failures".
CREATE TABLE contrib_exclusions (
    run_id   bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step     bigint NOT NULL CHECK (step >= 0),
    subject  bytea NOT NULL CHECK (length(subject) = 32),
    reporter bytea NOT NULL CHECK (length(reporter) = 32),
    reason   text NOT NULL CHECK (reason ~ '^[a-z0-9_]{1,15}$'),
    at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step, subject, reporter)
);
CREATE INDEX contrib_exclusions_at ON contrib_exclusions (run_id, at);

-- A second, different payload for a (run, step, peer) already reported. Kept
-- (at most one row per payload) so auditors can see who tried; never counted.
CREATE TABLE contrib_conflicts (
    run_id          bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step            bigint NOT NULL,
    peer_public_key bytea NOT NULL CHECK (length(peer_public_key) = 32),
    user_id         bigint NOT NULL REFERENCES users (id),
    payload_sha256  bytea NOT NULL CHECK (length(payload_sha256) = 32),
    payload         text NOT NULL,
    signature       bytea NOT NULL CHECK (length(signature) = 64),
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step, peer_public_key, payload_sha256)
);

-- Every report with its verification (docs/accounting.md, "Verification"):
-- inflated when the claim exceeds what every other member of the round saw;
-- verified = min(claim, least another member saw), and 0 when nobody
-- corroborated, someone excluded the peer at that step, or it is inflated.
CREATE VIEW contrib_claims AS
SELECT c.id, r.name AS run, c.run_id, c.step, u.username, c.user_id, c.peer_public_key,
       c.round_id, c.group_id, c.samples AS claimed_samples,
       s.seen_min, s.seen_max, coalesce(s.observers, 0) AS observers,
       (x.subject IS NOT NULL) AS excluded,
       CASE WHEN s.observers > 0 AND x.subject IS NULL
                 AND c.samples <= s.seen_max * (1 + 1e-9) + 1e-9
            THEN least(c.samples, s.seen_min) ELSE 0 END AS verified_samples,
       coalesce(c.samples > s.seen_max * (1 + 1e-9) + 1e-9, false) AS inflated,
       c.compute_s, c.loss, c.sps, c.round_ms, c.parts, c.parts_averaged, c.received_at
  FROM contrib_reports c
  JOIN runs r ON r.id = c.run_id
  JOIN users u ON u.id = c.user_id
  LEFT JOIN contrib_seen s ON s.run_id = c.run_id AND s.step = c.step
                          AND s.subject = c.peer_public_key AND s.round_id = c.round_id
  LEFT JOIN (SELECT DISTINCT run_id, step, subject FROM contrib_exclusions) x
         ON x.run_id = c.run_id AND x.step = c.step AND x.subject = c.peer_public_key;

CREATE VIEW contrib_peer_totals AS
SELECT run, username, peer_public_key, count(*) AS reports, count(DISTINCT step) AS steps,
       sum(claimed_samples) AS claimed_samples, sum(verified_samples) AS verified_samples,
       sum(compute_s) AS compute_s, count(*) FILTER (WHERE inflated) AS flagged_reports,
       min(received_at) AS first_at, max(received_at) AS last_at
  FROM contrib_claims GROUP BY run, username, peer_public_key;

CREATE VIEW contrib_user_totals AS
SELECT run, username, count(DISTINCT peer_public_key) AS peers, count(*) AS reports,
       count(DISTINCT step) AS steps, sum(claimed_samples) AS claimed_samples,
       sum(verified_samples) AS verified_samples, sum(compute_s) AS compute_s,
       count(*) FILTER (WHERE inflated) AS flagged_reports,
       min(received_at) AS first_at, max(received_at) AS last_at
  FROM contrib_claims GROUP BY run, username;

-- The learning curve: samples-weighted mean loss per step.
CREATE VIEW contrib_curve AS
SELECT r.name AS run, c.step,
       sum(c.loss * c.samples) FILTER (WHERE c.samples > 0 AND c.loss IS NOT NULL)
         / nullif(sum(c.samples) FILTER (WHERE c.samples > 0 AND c.loss IS NOT NULL), 0) AS loss,
       sum(c.samples) AS samples, count(*) AS peers, min(c.received_at) AS t
  FROM contrib_reports c JOIN runs r ON r.id = c.run_id
 GROUP BY r.name, c.step;
