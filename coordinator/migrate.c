/* Applies sql/NNN_*.sql migrations (see migrate.h). The file name's numeric
 * prefix is the version; its SHA-256 is recorded so an edited migration that
 * was already applied is reported. */
#include "coordinator/migrate.h"
#include "cm_crypto.h"
#include "cm_embed.h"
#include "cm_err.h"
#include "cm_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct cm_embedded coord_migrations[];
extern const unsigned coord_migrations_count;

/* Arbitrary constant identifying "crowdtrain migrations" for pg_advisory_lock. */
#define MIGRATE_LOCK_KEY 0x43524f5744L

static int exec_ok(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    ExecStatusType st = PQresultStatus(r);
    int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok)
        CM_LOGE("migrate", "%.60s...: %s", sql, PQerrorMessage(pg));
    PQclear(r);
    return ok;
}

static int version_of(const char *name)
{
    return atoi(name);
}

int coord_migrate_latest(void)
{
    int v = 0;
    for (unsigned i = 0; i < coord_migrations_count; i++)
        if (version_of(coord_migrations[i].name) > v)
            v = version_of(coord_migrations[i].name);
    return v;
}

int coord_migrate(PGconn *pg, int *applied, int *schema_version)
{
    *applied = 0;
    *schema_version = 0;
    char lock[96];
    snprintf(lock, sizeof lock, "SELECT pg_advisory_lock(%ld)", MIGRATE_LOCK_KEY);
    if (!exec_ok(pg, lock))
        return CM_EDB;
    int rc = CM_EDB;
    if (!exec_ok(pg, "CREATE TABLE IF NOT EXISTS schema_migrations ("
                     " version integer PRIMARY KEY, name text NOT NULL,"
                     " sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"))
        goto unlock;

    PGresult *r = PQexec(pg, "SELECT version, name, sha256 FROM schema_migrations ORDER BY version");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        CM_LOGE("migrate", "reading schema_migrations: %s", PQerrorMessage(pg));
        PQclear(r);
        goto unlock;
    }
    int latest = coord_migrate_latest(), db_max = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        int v = atoi(PQgetvalue(r, i, 0));
        if (v > db_max)
            db_max = v;
    }
    if (db_max > latest) {
        CM_LOGE("migrate",
                "the database schema is at version %d, newer than this coordinator knows (%d): "
                "upgrade crowdtrain-coordinator instead of running an older one",
                db_max, latest);
        PQclear(r);
        rc = CM_EVERSION;
        goto unlock;
    }

    /* Apply in version order (the embedded list is sorted by file name). */
    for (unsigned m = 0; m < coord_migrations_count; m++) {
        const struct cm_embedded *e = &coord_migrations[m];
        int v = version_of(e->name);
        uint8_t h[CM_SHA256_LEN];
        char hex[2 * CM_SHA256_LEN + 1];
        cm_sha256(e->data, e->len, h);
        cm_hex_encode(h, sizeof h, hex);
        int done = 0;
        for (int i = 0; i < PQntuples(r); i++) {
            if (atoi(PQgetvalue(r, i, 0)) == v) {
                done = 1;
                if (strcmp(PQgetvalue(r, i, 2), hex) != 0)
                    CM_LOGW("migrate", "migration %s was changed after it was applied", e->name);
            }
        }
        if (done)
            continue;
        CM_LOGI("migrate", "applying %s", e->name);
        if (!exec_ok(pg, "BEGIN")) {
            PQclear(r);
            goto unlock;
        }
        char vs[16];
        snprintf(vs, sizeof vs, "%d", v);
        const char *params[] = {vs, e->name, hex};
        int ok = exec_ok(pg, (const char *)e->data);
        if (ok) {
            PGresult *ins = PQexecParams(pg,
                                         "INSERT INTO schema_migrations (version, name, sha256) "
                                         "VALUES ($1, $2, $3)",
                                         3, NULL, params, NULL, NULL, 0);
            ok = PQresultStatus(ins) == PGRES_COMMAND_OK;
            if (!ok)
                CM_LOGE("migrate", "recording %s: %s", e->name, PQerrorMessage(pg));
            PQclear(ins);
        }
        if (!ok || !exec_ok(pg, "COMMIT")) {
            exec_ok(pg, "ROLLBACK");
            CM_LOGE("migrate", "migration %s failed; nothing of it was applied", e->name);
            PQclear(r);
            goto unlock;
        }
        (*applied)++;
    }
    PQclear(r);
    *schema_version = latest;
    rc = CM_OK;
unlock:
    snprintf(lock, sizeof lock, "SELECT pg_advisory_unlock(%ld)", MIGRATE_LOCK_KEY);
    exec_ok(pg, lock);
    return rc;
}
