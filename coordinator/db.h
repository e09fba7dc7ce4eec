/* A bounded pool of libpq connections for the coordinator's request
 * threads, and prepared statements declared next to the code that uses them.
 *
 * Handlers borrow a connection with coord_db_acquire (waiting at most the
 * pool's deadline; CM_EBUSY when none frees up), run parameterized
 * statements only — never SQL built from input — and give it back with
 * coord_db_release. A statement is declared once as a static struct
 * coord_db_stmt; each connection prepares it on first use. */
#ifndef COORD_DB_H
#define COORD_DB_H

#include <libpq-fe.h>
#include <stdint.h>

struct coord_db_stmt {
    const char *sql;
    int nparams;
    int id; /* assigned on first use; 0 = not yet */
};
#define COORD_DB_STMT(name, n, text) static struct coord_db_stmt name = {text, n, 0}
#define COORD_DB_MAX_STMTS 256

struct coord_db_conn {
    PGconn *pg;
    uint8_t prepared[COORD_DB_MAX_STMTS];
    int in_use;
};

struct coord_db_pool;

/* Opens `size` connections (fails if the first cannot be opened). Each
 * statement is limited to statement_timeout_ms on the server. */
int coord_db_pool_new(const char *url, int size, int acquire_timeout_ms, int statement_timeout_ms,
                      struct coord_db_pool **out);
void coord_db_pool_free(struct coord_db_pool *p);
int coord_db_acquire(struct coord_db_pool *p, struct coord_db_conn **out);
void coord_db_release(struct coord_db_pool *p, struct coord_db_conn *c);
/* Gauges for /metrics. */
void coord_db_pool_stats(struct coord_db_pool *p, int *size, int *in_use, uint64_t *waits,
                         uint64_t *timeouts);

/* Runs a prepared statement with text parameters (NULL = SQL NULL). Returns
 * the result (caller PQclear()s) or NULL after logging the server's message;
 * *sqlstate (if non-NULL) receives the 5-char SQLSTATE or "" (e.g. "23505"
 * for a unique violation). */
PGresult *coord_db_exec(struct coord_db_conn *c, struct coord_db_stmt *s,
                        const char *const *params, char sqlstate[6]);
/* Same with explicit lengths/formats (binary parameters such as keys). */
PGresult *coord_db_exec_bin(struct coord_db_conn *c, struct coord_db_stmt *s,
                            const char *const *params, const int *lengths, const int *formats,
                            char sqlstate[6]);
/* Plain command without parameters (BEGIN, COMMIT, ROLLBACK). */
int coord_db_cmd(struct coord_db_conn *c, const char *sql);

/* One-off connection (migrate, create-user). */
int coord_db_connect(const char *url, int statement_timeout_ms, PGconn **out);

#endif
