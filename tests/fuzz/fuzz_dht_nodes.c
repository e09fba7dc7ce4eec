/* libFuzzer target: the Nodes decoder dht_msg_parse_nodes() (contact lists).
 * Seeds in tests/fuzz/corpus/dht_nodes/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "dht/dht_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dht_msg_nodes n;
    if (dht_msg_parse_nodes(data, size, &n) == 0 && n.n > DHT_MAX_CONTACTS)
        abort();
    return 0;
}
