/* Files compiled into a binary by scripts/embed.sh (SQL migrations, the
 * OpenAPI document). `data` is NUL-terminated; `len` excludes the NUL. */
#ifndef CM_EMBED_H
#define CM_EMBED_H

#include <stddef.h>

struct cm_embedded {
    const char *name;
    const unsigned char *data;
    size_t len;
};

#endif
