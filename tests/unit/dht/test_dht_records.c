/* DHT building blocks without a network: XOR distance and buckets, the
 * routing table, record signatures, the record store's rules (newest
 * expiration wins, dictionary entries owned by their authors, expiry, TTL
 * bound, capacity) and round trips of every DHT message codec. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "dht/dht_msg.h"
#include "dht/dht_store.h"
#include "dht/dht_table.h"

static void test_distance_and_buckets(void **state)
{
    (void)state;
    uint8_t self[32] = {0}, a[32] = {0}, b[32] = {0};
    a[31] = 1; /* distance 1: bucket 0 */
    b[0] = 0x80; /* top bit differs: bucket 255 */
    assert_int_equal(dht_id_bucket(self, a), 0);
    assert_int_equal(dht_id_bucket(self, b), 255);
    assert_int_equal(dht_id_bucket(self, self), -1);
    assert_true(dht_id_cmp_dist(self, a, b) < 0);
    assert_true(dht_id_cmp_dist(self, b, a) > 0);
    assert_int_equal(dht_id_cmp_dist(self, a, a), 0);
    uint8_t r[32];
    cm_random_bytes(self, 32);
    for (int i = 0; i < 256; i += 7) {
        dht_id_random_in_bucket(self, i, r);
        assert_int_equal(dht_id_bucket(self, r), i);
    }
}

static void rand_contact(struct dht_contact *c)
{
    memset(c, 0, sizeof *c);
    cm_random_bytes(c->pub, 32);
    dht_id_of_pub(c->pub, c->id);
    c->addr.family = 4;
    c->addr.port = 1000;
    c->addr.ip[0] = 127;
    c->addr.ip[3] = 1;
}

static void test_table(void **state)
{
    (void)state;
    uint8_t self[32];
    cm_random_bytes(self, 32);
    struct dht_table t;
    dht_table_init(&t, self, 0);
    enum { N = 2000 };
    struct dht_contact *all = malloc(N * sizeof *all);
    for (int i = 0; i < N; i++) {
        rand_contact(&all[i]);
        assert_int_equal(dht_table_seen(&t, &all[i], i), 0);
    }
    /* Bucket 255 (half the space) holds at most k. */
    assert_int_equal(t.b[255].n, DHT_K);
    assert_true(t.count < N);
    /* closest() is sorted and agrees with a brute-force scan of the table. */
    uint8_t target[32];
    cm_random_bytes(target, 32);
    struct dht_contact out[DHT_K];
    size_t n = dht_table_closest(&t, target, out, DHT_K);
    assert_int_equal(n, DHT_K);
    for (size_t i = 1; i < n; i++)
        assert_true(dht_id_cmp_dist(target, out[i - 1].id, out[i].id) < 0);
    for (int bi = 0; bi < 256; bi++)
        for (int i = 0; i < t.b[bi].n; i++) {
            int in = 0;
            for (size_t j = 0; j < n; j++)
                in |= !memcmp(out[j].id, t.b[bi].c[i].id, 32);
            if (!in)
                assert_true(dht_id_cmp_dist(target, t.b[bi].c[i].id, out[n - 1].id) > 0);
        }
    /* A failing contact in a full bucket is replaced by a replacement. */
    uint8_t victim[32];
    memcpy(victim, t.b[255].c[0].id, 32);
    size_t before = t.count;
    assert_true(t.b[255].nrepl > 0);
    dht_table_failed(&t, victim);
    assert_int_equal(t.count, before);
    for (int i = 0; i < t.b[255].n; i++)
        assert_memory_not_equal(t.b[255].c[i].id, victim, 32);
    dht_table_cleanup(&t);
    free(all);
}

static void make_rec(struct dht_record *r, struct cm_ed25519 *k, const char *key,
                     const char *subkey, const char *value, int64_t exp)
{
    memset(r, 0, sizeof *r);
    dht_key_id(key, strlen(key), r->key);
    r->subkey = (uint8_t *)subkey;
    r->subkey_len = subkey ? strlen(subkey) : 0;
    r->value = (uint8_t *)value;
    r->value_len = strlen(value);
    r->expires_ms = exp;
    assert_int_equal(dht_record_sign(r, k), 0);
}

static void test_record_signature(void **state)
{
    (void)state;
    struct cm_ed25519 a, b;
    cm_ed25519_generate(&a);
    cm_ed25519_generate(&b);
    struct dht_record r;
    make_rec(&r, &a, "k", "sub", "v", 1000);
    assert_int_equal(dht_record_verify(&r), 0);
    r.expires_ms++; /* any field change breaks it */
    assert_int_equal(dht_record_verify(&r), CM_EBADSIG);
    r.expires_ms--;
    memcpy(r.author, b.pub, 32); /* claiming another author */
    assert_int_equal(dht_record_verify(&r), CM_EBADSIG);
    cm_ed25519_cleanup(&a);
    cm_ed25519_cleanup(&b);
}

static void test_store_rules(void **state)
{
    (void)state;
    struct cm_ed25519 a, b;
    cm_ed25519_generate(&a);
    cm_ed25519_generate(&b);
    struct dht_store s;
    assert_int_equal(dht_store_init(&s, 100, 3, 10000), 0);
    int64_t now = 1000;
    struct dht_record r1, r2, r3, d1, d2, d3;
    const struct dht_record *out[8];
    make_rec(&r1, &a, "k", NULL, "old", now + 500);
    make_rec(&r2, &b, "k", NULL, "new", now + 900);
    make_rec(&r3, &a, "k", NULL, "older", now + 100);
    assert_int_equal(dht_store_put(&s, &r1, now), 0);
    assert_int_equal(dht_store_put(&s, &r2, now), 0);       /* later expiration wins */
    assert_int_equal(dht_store_put(&s, &r3, now), CM_ESTATE); /* earlier one is refused */
    size_t n = dht_store_get(&s, r1.key, now, out, 8);
    assert_int_equal(n, 1);
    assert_memory_equal(out[0]->value, "new", 3);

    /* Dictionary: entries are (author, subkey); b cannot replace a's. */
    make_rec(&d1, &a, "dict", "x", "a-x", now + 500);
    make_rec(&d2, &b, "dict", "x", "b-x", now + 900);
    assert_int_equal(dht_store_put(&s, &d1, now), 0);
    assert_int_equal(dht_store_put(&s, &d2, now), 0);
    n = dht_store_get(&s, d1.key, now, out, 8);
    assert_int_equal(n, 2);
    int seen_a = 0;
    for (size_t i = 0; i < n; i++)
        if (!memcmp(out[i]->author, a.pub, 32)) {
            assert_memory_equal(out[i]->value, "a-x", 3);
            seen_a = 1;
        }
    assert_true(seen_a);
    /* a updates its own entry */
    make_rec(&d3, &a, "dict", "x", "a-x2", now + 600);
    assert_int_equal(dht_store_put(&s, &d3, now), 0);
    n = dht_store_get(&s, d1.key, now, out, 8);
    assert_int_equal(n, 2);

    /* Limits: expired, too far in the future, entries per key. */
    struct dht_record e;
    make_rec(&e, &a, "z", NULL, "v", now);
    assert_int_equal(dht_store_put(&s, &e, now), CM_EEXPIRED);
    make_rec(&e, &a, "z", NULL, "v", now + 20000);
    assert_int_equal(dht_store_put(&s, &e, now), CM_ERANGE);
    struct dht_record m[4];
    const char *subs[] = {"1", "2", "3", "4"};
    for (int i = 0; i < 4; i++) {
        make_rec(&m[i], &b, "many", subs[i], "v", now + 100);
        assert_int_equal(dht_store_put(&s, &m[i], now), i < 3 ? 0 : CM_ETOOBIG);
    }
    /* One author cannot hold more than its share (100 / 4 = 25 here). */
    {
        struct dht_store q;
        assert_int_equal(dht_store_init(&q, 100, 1000, 10000), 0);
        char sub[8];
        int stored = 0, refused = 0;
        for (int i = 0; i < 40; i++) {
            struct dht_record x;
            snprintf(sub, sizeof sub, "%d", i);
            make_rec(&x, &a, "flood", sub, "v", now + 100);
            int rc = dht_store_put(&q, &x, now);
            stored += rc == 0;
            refused += rc == CM_ETOOBIG;
        }
        assert_int_equal(stored, 25);
        assert_int_equal(refused, 15);
        struct dht_record y;
        make_rec(&y, &b, "flood", "b", "v", now + 100); /* others still get in */
        assert_int_equal(dht_store_put(&q, &y, now), 0);
        assert_int_equal(dht_store_purge(&q, now + 100), 26); /* shares are released */
        make_rec(&y, &a, "flood", "again", "v", now + 300);
        assert_int_equal(dht_store_put(&q, &y, now + 100), 0);
        dht_store_cleanup(&q);
    }
    /* Expiry: nothing live after its time, and purge frees it. */
    assert_int_equal(dht_store_get(&s, m[0].key, now + 100, out, 8), 0);
    size_t before = s.nrecords;
    assert_true(dht_store_purge(&s, now + 100) >= 3);
    assert_true(s.nrecords < before);
    assert_int_equal(dht_store_get(&s, r1.key, now + 100, out, 8), 1); /* "new" lives on */
    dht_store_cleanup(&s);
    cm_ed25519_cleanup(&a);
    cm_ed25519_cleanup(&b);
}

static void test_msg_roundtrips(void **state)
{
    (void)state;
    uint8_t t[32], t2[32], *buf;
    size_t len;
    cm_random_bytes(t, 32);
    assert_int_equal(dht_msg_encode_find(t, 0, &buf, &len), 0);
    assert_int_equal(dht_msg_parse_find(buf, len, t2), 0);
    assert_memory_equal(t, t2, 32);
    free(buf);
    assert_int_equal(dht_msg_encode_find(t, 1, &buf, &len), 0);
    assert_int_equal(dht_msg_parse_find(buf, len, t2), 0);
    assert_memory_equal(t, t2, 32);
    /* truncated */
    assert_int_not_equal(dht_msg_parse_find(buf, len - 1, t2), 0);
    free(buf);

    struct dht_contact c[DHT_MAX_CONTACTS];
    for (int i = 0; i < DHT_MAX_CONTACTS; i++)
        rand_contact(&c[i]);
    c[3].addr.family = 6;
    c[3].addr.ip[15] = 1;
    struct dht_msg_nodes nd;
    assert_int_equal(dht_msg_encode_nodes(c, DHT_MAX_CONTACTS, &buf, &len), 0);
    assert_int_equal(dht_msg_parse_nodes(buf, len, &nd), 0);
    assert_int_equal(nd.n, DHT_MAX_CONTACTS);
    for (int i = 0; i < DHT_MAX_CONTACTS; i++) {
        assert_memory_equal(nd.c[i].id, c[i].id, 32);
        assert_int_equal(nd.c[i].addr.family, c[i].addr.family);
        assert_int_equal(nd.c[i].addr.port, c[i].addr.port);
    }
    free(buf);

    struct cm_ed25519 a;
    cm_ed25519_generate(&a);
    struct dht_record r[3];
    make_rec(&r[0], &a, "k", NULL, "plain", 5000);
    make_rec(&r[1], &a, "k", "s1", "one", 6000);
    make_rec(&r[2], &a, "k", "s2", "two", 7000);
    const struct dht_record *rp[3] = {&r[0], &r[1], &r[2]};
    struct dht_msg_values v;
    assert_int_equal(dht_msg_encode_values(rp, 3, c, 5, 1 << 20, &buf, &len), 0);
    assert_int_equal(dht_msg_parse_values(buf, len, &v), 0);
    assert_int_equal(v.r.n, 3);
    assert_int_equal(v.nodes.n, 5);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dht_record_verify(&v.r.rec[i]), 0);
        assert_int_equal(v.r.rec[i].expires_ms, r[i].expires_ms);
    }
    dht_msg_values_cleanup(&v);
    free(buf);
    /* the byte budget keeps whole records only */
    assert_int_equal(dht_msg_encode_values(rp, 3, NULL, 0, 200, &buf, &len), 0);
    assert_int_equal(dht_msg_parse_values(buf, len, &v), 0);
    assert_true(v.r.n < 3 && len <= 200);
    dht_msg_values_cleanup(&v);
    free(buf);

    struct dht_msg_records st;
    assert_int_equal(dht_msg_encode_store(rp, 3, &buf, &len), 0);
    assert_int_equal(dht_msg_parse_store(buf, len, &st), 0);
    assert_int_equal(st.n, 3);
    assert_memory_equal(st.rec[2].subkey, "s2", 2);
    dht_msg_records_cleanup(&st);
    free(buf);

    int32_t status[2] = {0, CM_EBADSIG};
    struct dht_msg_store_result sr;
    assert_int_equal(dht_msg_encode_store_result(status, 2, &buf, &len), 0);
    assert_int_equal(dht_msg_parse_store_result(buf, len, &sr), 0);
    assert_int_equal(sr.n, 2);
    assert_int_equal(sr.status[1], CM_EBADSIG);
    free(buf);

    /* A contact with a 3-byte IP or port 0 is refused. */
    uint8_t bad[] = {0x0a, 0x2b, 0x0a, 0x20, 0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
                     0x12, 0x03, 1, 2, 3, 0x18, 0x01};
    assert_int_not_equal(dht_msg_parse_nodes(bad, sizeof bad, &nd), 0);
    cm_ed25519_cleanup(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distance_and_buckets), cmocka_unit_test(test_table),
        cmocka_unit_test(test_record_signature),     cmocka_unit_test(test_store_rules),
        cmocka_unit_test(test_msg_roundtrips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
