/* Wire codec of the DHT messages (p2p.proto: FindNode, Nodes, FindValue,
 * Values, Store, StoreResult). Every decoder is a pure function
 * parse(buf, len, &out) that bounds every count and length (fuzzed by
 * tests/fuzz/fuzz_dht_*.c); encoders return heap buffers the caller frees.
 * Record signatures are not checked here (see dht_record_verify). */
#ifndef DHT_MSG_H
#define DHT_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "dht/dht_types.h"

struct dht_msg_nodes {
    size_t n;
    struct dht_contact c[DHT_MAX_CONTACTS];
};

struct dht_msg_records {
    size_t n;
    struct dht_record *rec; /* owned; n entries */
};

struct dht_msg_values {
    struct dht_msg_records r;
    struct dht_msg_nodes nodes;
};

struct dht_msg_store_result {
    size_t n;
    int32_t status[DHT_MAX_STORE_RECORDS];
};

/* FindNode and FindValue: a 32-byte target. */
int dht_msg_parse_find(const uint8_t *buf, size_t len, uint8_t target[DHT_ID_LEN]);
int dht_msg_encode_find(const uint8_t target[DHT_ID_LEN], int find_value, uint8_t **out,
                        size_t *len);

int dht_msg_parse_nodes(const uint8_t *buf, size_t len, struct dht_msg_nodes *out);
int dht_msg_encode_nodes(const struct dht_contact *c, size_t n, uint8_t **out, size_t *len);

/* Values: records (at most DHT_MAX_VALUE_RECORDS) and contacts. The encoder
 * includes records in order while the message stays under max_bytes. */
int dht_msg_parse_values(const uint8_t *buf, size_t len, struct dht_msg_values *out);
int dht_msg_encode_values(const struct dht_record *const *rec, size_t nrec,
                          const struct dht_contact *c, size_t nc, size_t max_bytes, uint8_t **out,
                          size_t *len);
void dht_msg_values_cleanup(struct dht_msg_values *v);

/* Store: 1..DHT_MAX_STORE_RECORDS records. */
int dht_msg_parse_store(const uint8_t *buf, size_t len, struct dht_msg_records *out);
int dht_msg_encode_store(const struct dht_record *const *rec, size_t n, uint8_t **out,
                         size_t *len);
void dht_msg_records_cleanup(struct dht_msg_records *r);

int dht_msg_parse_store_result(const uint8_t *buf, size_t len, struct dht_msg_store_result *out);
int dht_msg_encode_store_result(const int32_t *status, size_t n, uint8_t **out, size_t *len);

#endif
