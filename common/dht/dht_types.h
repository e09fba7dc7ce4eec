/* Basic DHT types shared by the routing table, the record store, the wire
 * codec and the node: 256-bit ids, XOR distance, compact contacts, records.
 * Kademlia (seed 002_2b00836ea4b30f79.txt, section 2.4 and Appendix B): node
 * id = SHA-256 of the peer's Ed25519 public key, key id = SHA-256 of the
 * key string, distance = id XOR id compared as a big-endian integer. */
#ifndef DHT_TYPES_H
#define DHT_TYPES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define DHT_ID_LEN 32
#define DHT_K 20
#define DHT_ALPHA 3
#define DHT_MAX_SUBKEY 128
#define DHT_MAX_VALUE 16384
#define DHT_MAX_CONTACTS 20     /* per Nodes / Values message */
#define DHT_MAX_STORE_RECORDS 16 /* per Store message */
#define DHT_MAX_VALUE_RECORDS 64 /* per Values message */

struct dht_addr {
    uint8_t family; /* 4 or 6 */
    uint16_t port;
    uint8_t ip[16];
};

struct dht_contact {
    uint8_t id[DHT_ID_LEN];
    uint8_t pub[32];
    struct dht_addr addr;
    int64_t last_seen_ms;
    uint8_t fails;
};

/* One stored item (see p2p.proto, message Record). Owned buffers. */
struct dht_record {
    uint8_t key[DHT_ID_LEN];
    uint8_t *subkey; /* NULL when subkey_len == 0 */
    size_t subkey_len;
    uint8_t *value;
    size_t value_len;
    int64_t expires_ms;
    uint8_t author[32];
    uint8_t sig[64];
};

void dht_id_of_pub(const uint8_t pub[32], uint8_t id[DHT_ID_LEN]);
void dht_key_id(const void *key, size_t len, uint8_t id[DHT_ID_LEN]);
/* <0, 0, >0 as a is closer to / as close as / farther from target than b. */
int dht_id_cmp_dist(const uint8_t *target, const uint8_t *a, const uint8_t *b);
/* Index of the highest differing bit: 255 - (leading zero bits of a^b);
 * -1 when equal. Bucket i holds ids at distance [2^i, 2^(i+1)). */
int dht_id_bucket(const uint8_t *self, const uint8_t *id);
void dht_id_random_in_bucket(const uint8_t *self, int bucket, uint8_t out[DHT_ID_LEN]);

int dht_addr_from_sockaddr(const struct sockaddr *sa, struct dht_addr *out);
void dht_addr_to_sockaddr(const struct dht_addr *a, struct sockaddr_storage *out);

/* Record signatures: the author signs "crowdtrain-dht-v1" || key ||
 * u32 subkey_len || subkey || u32 value_len || value || i64 expires_ms
 * (big endian). */
int dht_record_sign(struct dht_record *r, const void *author_key /* struct cm_ed25519 */);
int dht_record_verify(const struct dht_record *r);
int dht_record_copy(struct dht_record *dst, const struct dht_record *src);
void dht_record_cleanup(struct dht_record *r);

#endif
