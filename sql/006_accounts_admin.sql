-- Fair login throttling and account administration (issue 22, findings 3
-- and 7). docs/architecture.md, "Accounts and sessions", gives the rules.

-- Usernames are unique ignoring case. Accounts that already differ only by
-- case are kept (refusing the migration would stop the coordinator until
-- someone edited the database by hand, and renaming would change the name
-- their owners log in with and that allowlists and passes carry): the oldest
-- of each group keeps case_dup = 0, the later ones get 1, 2, ...; every new
-- account has 0, so it collides with any existing name of the same letters.
ALTER TABLE users ADD COLUMN case_dup smallint NOT NULL DEFAULT 0 CHECK (case_dup >= 0);
UPDATE users u SET case_dup = d.n
FROM (SELECT id, row_number() OVER (PARTITION BY lower(username) ORDER BY id) - 1 AS n
      FROM users) d
WHERE d.id = u.id AND d.n > 0;
CREATE UNIQUE INDEX users_username_ci ON users (lower(username), case_dup);

-- Addresses a user has logged in from successfully: they stay open to the
-- owner when guesses from elsewhere have spent the username's global budget.
CREATE TABLE login_known (
    username  text NOT NULL,
    client_ip text NOT NULL,
    last_ok   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (username, client_ip)
);

-- Admits one login attempt or refuses it, atomically. An admitted attempt is
-- recorded as a failure before the password is checked (the caller deletes
-- the row when the password is right), so parallel guesses count each other:
-- under the advisory locks on the key and the address, each attempt sees
-- every earlier one, committed before the locks were let go.
--   p_key       the username (or 'idp:<provider>' for identity-provider logins)
--   p_ip        the client address (IPv6 reduced to its /64 by the caller)
--   p_max_pair  failures allowed per (key, address) in the window
--   p_max_ip    failures allowed per address, all keys together
--   p_max_key   failures allowed per key from all addresses together, except
--               from an address in login_known for this key (0: no such cap)
-- Returns the id of the recorded attempt (> 0), or -1 (per key and address),
-- -2 (per address) or -3 (per key) when refused; nothing is recorded then.
CREATE FUNCTION login_attempt(p_key text, p_ip text, p_window_s bigint, p_max_pair bigint,
                              p_max_ip bigint, p_max_key bigint)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    since timestamptz := now() - make_interval(secs => p_window_s);
    n bigint;
    new_id bigint;
BEGIN
    -- Always the key first, then the address: no two attempts wait on each other in a cycle.
    PERFORM pg_advisory_xact_lock(hashtext('crowdtrain.login.key'), hashtext(p_key));
    PERFORM pg_advisory_xact_lock(hashtext('crowdtrain.login.ip'), hashtext(p_ip));
    -- Rows past the window count for nothing: drop this key's and this address's.
    DELETE FROM login_failures WHERE username = p_key AND at <= since;
    DELETE FROM login_failures WHERE client_ip = p_ip AND at <= since;
    SELECT count(*) INTO n FROM login_failures
     WHERE username = p_key AND client_ip = p_ip AND at > since;
    IF n >= p_max_pair THEN
        RETURN -1;
    END IF;
    SELECT count(*) INTO n FROM login_failures WHERE client_ip = p_ip AND at > since;
    IF n >= p_max_ip THEN
        RETURN -2;
    END IF;
    IF p_max_key > 0 THEN
        SELECT count(*) INTO n FROM login_failures WHERE username = p_key AND at > since;
        IF n >= p_max_key AND NOT EXISTS (
                SELECT 1 FROM login_known k WHERE k.username = p_key AND k.client_ip = p_ip
                   AND k.last_ok > now() - interval '90 days') THEN
            RETURN -3;
        END IF;
    END IF;
    INSERT INTO login_failures (username, client_ip) VALUES (p_key, p_ip) RETURNING login_failures.id INTO new_id;
    RETURN new_id;
END
$$;
