#include "agent/train/steplog.h"
#include "cm_crypto.h"
#include "cm_err.h"

#include <stdlib.h>
#include <unistd.h>

int agent_param_hash(const struct kern_model *m, char hex[65])
{
    float *host = malloc(m->nparams * sizeof *host);
    if (!host)
        return CM_ENOMEM;
    int rc = m->be->download(host, m->params, m->nparams * sizeof *host);
    if (rc == CM_OK) {
        uint8_t h[CM_SHA256_LEN];
        cm_sha256(host, m->nparams * sizeof *host, h);
        cm_hex_encode(h, sizeof h, hex);
    }
    free(host);
    return rc;
}

void agent_steplog_write(FILE *f, const char *json_line)
{
    if (!f)
        return;
    fprintf(f, "%s\n", json_line);
    fflush(f);
}
