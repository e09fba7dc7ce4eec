/* libpq connection pool and lazily prepared statements (see db.h). A broken
 * connection is reset when it is next acquired, so a database restart costs
 * the in-flight requests only. */
#include "coordinator/db.h"
#include "cm_err.h"
#include "cm_log.h"
#include "cm_time.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct coord_db_pool {
    char *url;
    int size, acquire_timeout_ms, statement_timeout_ms;
    struct coord_db_conn *conns;
    int free_count;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t waits, timeouts;
};

static atomic_int g_next_stmt_id = 1;
static pthread_mutex_t g_stmt_mu = PTHREAD_MUTEX_INITIALIZER;

static int configure(PGconn *pg, int statement_timeout_ms)
{
    char sql[128];
    snprintf(sql, sizeof sql, "SET statement_timeout = %d; SET lock_timeout = %d", statement_timeout_ms,
             statement_timeout_ms);
    PGresult *r = PQexec(pg, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        CM_LOGE("db", "configuring connection: %s", PQerrorMessage(pg));
    PQclear(r);
    return ok ? CM_OK : CM_EDB;
}

static void on_notice(void *arg, const char *msg)
{
    (void)arg;
    CM_LOGD("db", "%.*s", (int)strcspn(msg, "\n"), msg);
}

int coord_db_connect(const char *url, int statement_timeout_ms, PGconn **out)
{
    *out = NULL;
    /* connect_timeout bounds the TCP and authentication phase. */
    const char *keys[] = {"dbname", "connect_timeout", "application_name", NULL};
    const char *vals[] = {url, "10", "crowdtrain-coordinator", NULL};
    PGconn *pg = PQconnectdbParams(keys, vals, 1);
    if (!pg)
        return CM_ENOMEM;
    if (PQstatus(pg) != CONNECTION_OK) {
        CM_LOGE("db", "connecting to the database: %s", PQerrorMessage(pg));
        PQfinish(pg);
        return CM_ECONN;
    }
    PQsetNoticeProcessor(pg, on_notice, NULL);
    if (configure(pg, statement_timeout_ms) != CM_OK) {
        PQfinish(pg);
        return CM_EDB;
    }
    *out = pg;
    return CM_OK;
}

int coord_db_pool_new(const char *url, int size, int acquire_timeout_ms, int statement_timeout_ms,
                      struct coord_db_pool **out)
{
    *out = NULL;
    if (size < 1 || size > 1024)
        return CM_EINVAL;
    struct coord_db_pool *p = calloc(1, sizeof *p);
    if (!p)
        return CM_ENOMEM;
    p->url = strdup(url);
    p->conns = calloc((size_t)size, sizeof *p->conns);
    if (!p->url || !p->conns) {
        free(p->url);
        free(p->conns);
        free(p);
        return CM_ENOMEM;
    }
    p->size = size;
    p->acquire_timeout_ms = acquire_timeout_ms;
    p->statement_timeout_ms = statement_timeout_ms;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int i = 0; i < size; i++) {
        int rc = coord_db_connect(url, statement_timeout_ms, &p->conns[i].pg);
        if (rc != CM_OK) {
            coord_db_pool_free(p);
            return rc;
        }
    }
    p->free_count = size;
    *out = p;
    return CM_OK;
}

void coord_db_pool_free(struct coord_db_pool *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->size; i++)
        if (p->conns[i].pg)
            PQfinish(p->conns[i].pg);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->conns);
    free(p->url);
    free(p);
}

int coord_db_acquire(struct coord_db_pool *p, struct coord_db_conn **out)
{
    struct timespec dl = cm_time_after_ms(CLOCK_REALTIME, p->acquire_timeout_ms);
    pthread_mutex_lock(&p->mu);
    if (p->free_count == 0)
        p->waits++;
    while (p->free_count == 0) {
        if (pthread_cond_timedwait(&p->cv, &p->mu, &dl) == ETIMEDOUT && p->free_count == 0) {
            p->timeouts++;
            pthread_mutex_unlock(&p->mu);
            return CM_EBUSY;
        }
    }
    struct coord_db_conn *c = NULL;
    for (int i = 0; i < p->size; i++) {
        if (!p->conns[i].in_use) {
            c = &p->conns[i];
            break;
        }
    }
    c->in_use = 1;
    p->free_count--;
    pthread_mutex_unlock(&p->mu);

    if (!c->pg || PQstatus(c->pg) != CONNECTION_OK) {
        /* The server went away or restarted: reconnect, forgetting prepared statements. */
        if (c->pg)
            PQfinish(c->pg);
        c->pg = NULL;
        memset(c->prepared, 0, sizeof c->prepared);
        int rc = coord_db_connect(p->url, p->statement_timeout_ms, &c->pg);
        if (rc != CM_OK) {
            coord_db_release(p, c);
            return rc;
        }
    }
    *out = c;
    return CM_OK;
}

void coord_db_release(struct coord_db_pool *p, struct coord_db_conn *c)
{
    /* A connection returned mid-transaction (a handler bailed out) is rolled back. */
    if (c->pg && PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
        PGresult *r = PQexec(c->pg, "ROLLBACK");
        PQclear(r);
    }
    pthread_mutex_lock(&p->mu);
    c->in_use = 0;
    p->free_count++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void coord_db_pool_stats(struct coord_db_pool *p, int *size, int *in_use, uint64_t *waits,
                         uint64_t *timeouts)
{
    pthread_mutex_lock(&p->mu);
    *size = p->size;
    *in_use = p->size - p->free_count;
    *waits = p->waits;
    *timeouts = p->timeouts;
    pthread_mutex_unlock(&p->mu);
}

static int stmt_id(struct coord_db_stmt *s)
{
    int id = __atomic_load_n(&s->id, __ATOMIC_ACQUIRE);
    if (id)
        return id;
    pthread_mutex_lock(&g_stmt_mu);
    if (!s->id) {
        int n = atomic_fetch_add(&g_next_stmt_id, 1);
        if (n >= COORD_DB_MAX_STMTS) {
            pthread_mutex_unlock(&g_stmt_mu);
            return -1;
        }
        __atomic_store_n(&s->id, n, __ATOMIC_RELEASE);
    }
    id = s->id;
    pthread_mutex_unlock(&g_stmt_mu);
    return id;
}

static void copy_state(const PGresult *r, char sqlstate[6])
{
    if (!sqlstate)
        return;
    const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    snprintf(sqlstate, 6, "%s", st ? st : "");
}

PGresult *coord_db_exec_bin(struct coord_db_conn *c, struct coord_db_stmt *s,
                            const char *const *params, const int *lengths, const int *formats,
                            char sqlstate[6])
{
    if (sqlstate)
        sqlstate[0] = '\0';
    int id = stmt_id(s);
    if (id < 0) {
        CM_LOGE("db", "too many prepared statements (raise COORD_DB_MAX_STMTS)");
        return NULL;
    }
    char name[16];
    snprintf(name, sizeof name, "s%d", id);
    if (!c->prepared[id]) {
        PGresult *r = PQprepare(c->pg, name, s->sql, s->nparams, NULL);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            CM_LOGE("db", "preparing statement: %s", PQerrorMessage(c->pg));
            copy_state(r, sqlstate);
            PQclear(r);
            return NULL;
        }
        PQclear(r);
        c->prepared[id] = 1;
    }
    PGresult *r = PQexecPrepared(c->pg, name, s->nparams, params, lengths, formats, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        copy_state(r, sqlstate);
        /* Constraint violations are expected outcomes the caller maps to 409/400. */
        if (!sqlstate || strncmp(sqlstate, "23", 2) != 0)
            CM_LOGE("db", "statement failed: %s", PQerrorMessage(c->pg));
        PQclear(r);
        return NULL;
    }
    return r;
}

PGresult *coord_db_exec(struct coord_db_conn *c, struct coord_db_stmt *s,
                        const char *const *params, char sqlstate[6])
{
    return coord_db_exec_bin(c, s, params, NULL, NULL, sqlstate);
}

int coord_db_cmd(struct coord_db_conn *c, const char *sql)
{
    PGresult *r = PQexec(c->pg, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        CM_LOGE("db", "%s: %s", sql, PQerrorMessage(c->pg));
    PQclear(r);
    return ok ? CM_OK : CM_EDB;
}
