/* libFuzzer target: the Store and StoreResult decoders.
 * Seeds in tests/fuzz/corpus/dht_store/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "dht/dht_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dht_msg_records r;
    if (dht_msg_parse_store(data, size, &r) == 0) {
        if (r.n == 0 || r.n > DHT_MAX_STORE_RECORDS)
            abort();
        dht_msg_records_cleanup(&r);
    }
    struct dht_msg_store_result sr;
    dht_msg_parse_store_result(data, size, &sr);
    return 0;
}
