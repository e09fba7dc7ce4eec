-- Proof of possession and key ownership for access passes (issue 22,
-- finding 4; docs/protocol.md, "Pass requests"). A peer key belongs to the
-- first user who proved to hold it; nobody else gets a pass for it until an
-- organizer releases it. An organizer can block a key: no pass is minted for
-- it, in any run, until released.
CREATE TABLE peer_keys (
    peer_public_key bytea PRIMARY KEY CHECK (length(peer_public_key) = 32),
    user_id         bigint REFERENCES users (id),   -- NULL: blocked before anyone claimed it
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    revoked_at      timestamptz,
    revoked_by      bigint REFERENCES users (id),
    revoke_reason   text,
    CHECK (user_id IS NOT NULL OR revoked_at IS NOT NULL)
);
CREATE INDEX peer_keys_user ON peer_keys (user_id);

-- Keys that already have passes belong to the user of their first pass
-- (before this migration anyone could ask for any key; if two users did, the
-- later one loses the key and an organizer can release it).
INSERT INTO peer_keys (peer_public_key, user_id, claimed_at)
SELECT DISTINCT ON (peer_public_key) peer_public_key, user_id, issued_at
FROM passes ORDER BY peer_public_key, issued_at, id;

-- The nonce of the signed request a pass was minted for: a (key, nonce)
-- pair is accepted once, so a captured request cannot be replayed within
-- its freshness window. NULL for passes from before this migration.
ALTER TABLE passes ADD COLUMN request_nonce bytea
    CHECK (request_nonce IS NULL OR length(request_nonce) = 16);
CREATE UNIQUE INDEX passes_request_nonce ON passes (peer_public_key, request_nonce);
