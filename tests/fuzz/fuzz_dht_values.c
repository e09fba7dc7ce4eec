/* libFuzzer target: the Values decoder dht_msg_parse_values() (records and contacts), with signature checks on what it decoded.
 * Seeds in tests/fuzz/corpus/dht_values/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "dht/dht_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dht_msg_values v;
    if (dht_msg_parse_values(data, size, &v) == 0) {
        if (v.r.n > DHT_MAX_VALUE_RECORDS || v.nodes.n > DHT_MAX_CONTACTS)
            abort();
        for (size_t i = 0; i < v.r.n && i < 2; i++)
            dht_record_verify(&v.r.rec[i]);
        dht_msg_values_cleanup(&v);
    }
    return 0;
}
