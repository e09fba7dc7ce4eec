/* Schema migrations: the numbered files in sql/, compiled into the binary,
 * applied in order, each in its own transaction together with its row in
 * schema_migrations. An advisory lock serializes coordinators starting at
 * once against one database. A database already migrated past what this
 * binary knows is refused (CM_EVERSION): an old coordinator must not write
 * to a newer schema. */
#ifndef COORD_MIGRATE_H
#define COORD_MIGRATE_H

#include <libpq-fe.h>

/* Applies pending migrations; *applied receives how many ran. */
int coord_migrate(PGconn *pg, int *applied, int *schema_version);
/* Highest migration version compiled into this binary. */
int coord_migrate_latest(void);

#endif
