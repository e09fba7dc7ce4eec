/* libFuzzer target: the FindNode / FindValue decoder dht_msg_parse_find().
 * Seeds in tests/fuzz/corpus/dht_find/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "dht/dht_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t t[DHT_ID_LEN];
    dht_msg_parse_find(data, size, t);
    return 0;
}
