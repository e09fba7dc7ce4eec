/* libFuzzer target for coord_url_unescape, which decodes every request's
 * path and query (coordinator/http_guard.c): never longer than its input,
 * and a reported control character is really there. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/http_guard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    size_t in = strlen(s);
    int control = 0;
    size_t n = coord_url_unescape(s, &control);
    if (n > in)
        __builtin_trap();
    int seen = 0;
    for (size_t i = 0; i < n; i++)
        seen |= (unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f;
    if (seen != control)
        __builtin_trap();
    free(s);
    return 0;
}
