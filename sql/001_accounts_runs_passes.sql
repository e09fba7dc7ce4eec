-- Accounts, sessions, runs, allowlists, access passes and the audit log.
-- Applied by crowdtrain-coordinator in one transaction; see coordinator/migrate.c.

CREATE TABLE users (
    id            bigserial PRIMARY KEY,
    username      text NOT NULL UNIQUE
                  CHECK (username ~ '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$'),
    role          text NOT NULL CHECK (role IN ('organizer', 'auditor', 'volunteer')),
    password_hash text,               -- argon2id encoded; NULL for identity-provider accounts
    disabled      boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Accounts known through an external identity provider: (provider, subject) -> user.
CREATE TABLE external_identities (
    provider   text NOT NULL,
    subject    text NOT NULL,
    user_id    bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, subject)
);

-- Bearer sessions; only the SHA-256 of the token is stored.
CREATE TABLE sessions (
    token_hash bytea PRIMARY KEY CHECK (length(token_hash) = 32),
    user_id    bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX sessions_expires ON sessions (expires_at);

-- Failed logins, for throttling guesses per username and per client address.
CREATE TABLE login_failures (
    id        bigserial PRIMARY KEY,
    username  text NOT NULL,
    client_ip text NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX login_failures_user ON login_failures (username, at);
CREATE INDEX login_failures_ip ON login_failures (client_ip, at);

CREATE TABLE runs (
    id                bigserial PRIMARY KEY,
    name              text NOT NULL UNIQUE
                      CHECK (name ~ '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$'),
    status            text NOT NULL DEFAULT 'open'
                      CHECK (status IN ('open', 'paused', 'finished')),
    description       text NOT NULL DEFAULT '',
    model_summary     text NOT NULL DEFAULT '',
    target_batch_size bigint NOT NULL CHECK (target_batch_size > 0),
    config            jsonb NOT NULL DEFAULT '{}',
    created_by        bigint REFERENCES users (id),
    created_at        timestamptz NOT NULL DEFAULT now()
);

-- Allowlisted usernames per run. Usernames, not user ids: an organizer can
-- allowlist someone who will first log in through the identity provider later.
CREATE TABLE run_allowlist (
    run_id   bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    username text NOT NULL,
    added_by bigint REFERENCES users (id),
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, username)
);

-- Every coordinator's signing key, so a token from any of them verifies.
CREATE TABLE signing_keys (
    kid        text PRIMARY KEY,
    public_key bytea NOT NULL UNIQUE CHECK (length(public_key) = 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Every pass ever issued (seed 000, Appendix H.4).
CREATE TABLE passes (
    id              bigserial PRIMARY KEY,
    run_id          bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    user_id         bigint NOT NULL REFERENCES users (id),
    peer_public_key bytea NOT NULL CHECK (length(peer_public_key) = 32),
    kid             text NOT NULL REFERENCES signing_keys (kid),
    issued_at       timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    revoked_by      bigint REFERENCES users (id),
    revoke_reason   text,
    CHECK (expires_at > issued_at)
);
CREATE INDEX passes_run_user ON passes (run_id, user_id);
CREATE INDEX passes_revoked ON passes (run_id, expires_at) WHERE revoked_at IS NOT NULL;

-- Every administrative action, who did it and from where.
CREATE TABLE audit_log (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor_id  bigint REFERENCES users (id),
    actor     text NOT NULL,
    action    text NOT NULL,
    target    text NOT NULL DEFAULT '',
    details   jsonb NOT NULL DEFAULT '{}',
    client_ip text NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_at ON audit_log (at);
