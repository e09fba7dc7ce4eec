/* DHT message codec over the protobuf-c generated code (see dht_msg.h). */
#include "dht/dht_msg.h"
#include "p2p/p2p.pb-c.h"

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

#define PACK_INTO(type, msg, out, len)                                                            \
    do {                                                                                          \
        *(len) = ctp2p__##type##__get_packed_size(msg);                                         \
        *(out) = malloc(*(len) ? *(len) : 1);                                                     \
        if (!*(out))                                                                              \
            return CM_ENOMEM;                                                                     \
        ctp2p__##type##__pack(msg, *(out));                                                       \
    } while (0)

int dht_msg_parse_find(const uint8_t *buf, size_t len, uint8_t target[DHT_ID_LEN])
{
    /* FindNode and FindValue share the layout (field 1: 32 bytes). */
    Ctp2p__FindNode *m = ctp2p__find_node__unpack(NULL, len, buf);
    if (!m)
        return CM_EPARSE;
    int ok = m->target.len == DHT_ID_LEN;
    if (ok)
        memcpy(target, m->target.data, DHT_ID_LEN);
    ctp2p__find_node__free_unpacked(m, NULL);
    return ok ? CM_OK : CM_EPARSE;
}

int dht_msg_encode_find(const uint8_t target[DHT_ID_LEN], int find_value, uint8_t **out,
                        size_t *len)
{
    if (find_value) {
        Ctp2p__FindValue m = CTP2P__FIND_VALUE__INIT;
        m.key.data = (uint8_t *)target;
        m.key.len = DHT_ID_LEN;
        PACK_INTO(find_value, &m, out, len);
    } else {
        Ctp2p__FindNode m = CTP2P__FIND_NODE__INIT;
        m.target.data = (uint8_t *)target;
        m.target.len = DHT_ID_LEN;
        PACK_INTO(find_node, &m, out, len);
    }
    return CM_OK;
}

static int contact_from_pb(const Ctp2p__Contact *pc, struct dht_contact *c)
{
    memset(c, 0, sizeof *c);
    if (pc->public_key.len != 32 || (pc->ip.len != 4 && pc->ip.len != 16) || pc->port == 0 ||
        pc->port > 65535)
        return CM_EPARSE;
    memcpy(c->pub, pc->public_key.data, 32);
    dht_id_of_pub(c->pub, c->id);
    c->addr.family = pc->ip.len == 4 ? 4 : 6;
    c->addr.port = (uint16_t)pc->port;
    memcpy(c->addr.ip, pc->ip.data, pc->ip.len);
    return CM_OK;
}

static int nodes_from_pb(Ctp2p__Contact **pcs, size_t n, struct dht_msg_nodes *out)
{
    out->n = 0;
    if (n > DHT_MAX_CONTACTS)
        return CM_EPARSE;
    for (size_t i = 0; i < n; i++)
        if (contact_from_pb(pcs[i], &out->c[out->n++]))
            return CM_EPARSE;
    return CM_OK;
}

struct pb_contacts {
    Ctp2p__Contact c[DHT_MAX_CONTACTS];
    Ctp2p__Contact *p[DHT_MAX_CONTACTS];
};

static size_t contacts_to_pb(const struct dht_contact *c, size_t n, struct pb_contacts *pc)
{
    if (n > DHT_MAX_CONTACTS)
        n = DHT_MAX_CONTACTS;
    for (size_t i = 0; i < n; i++) {
        ctp2p__contact__init(&pc->c[i]);
        pc->c[i].public_key.data = (uint8_t *)c[i].pub;
        pc->c[i].public_key.len = 32;
        pc->c[i].ip.data = (uint8_t *)c[i].addr.ip;
        pc->c[i].ip.len = c[i].addr.family == 4 ? 4 : 16;
        pc->c[i].port = c[i].addr.port;
        pc->p[i] = &pc->c[i];
    }
    return n;
}

int dht_msg_parse_nodes(const uint8_t *buf, size_t len, struct dht_msg_nodes *out)
{
    out->n = 0;
    Ctp2p__Nodes *m = ctp2p__nodes__unpack(NULL, len, buf);
    if (!m)
        return CM_EPARSE;
    int rc = nodes_from_pb(m->contacts, m->n_contacts, out);
    ctp2p__nodes__free_unpacked(m, NULL);
    if (rc)
        out->n = 0;
    return rc;
}

int dht_msg_encode_nodes(const struct dht_contact *c, size_t n, uint8_t **out, size_t *len)
{
    struct pb_contacts pc;
    Ctp2p__Nodes m = CTP2P__NODES__INIT;
    m.n_contacts = contacts_to_pb(c, n, &pc);
    m.contacts = pc.p;
    PACK_INTO(nodes, &m, out, len);
    return CM_OK;
}

static int record_from_pb(const Ctp2p__Record *p, struct dht_record *r)
{
    memset(r, 0, sizeof *r);
    if (p->key.len != DHT_ID_LEN || p->subkey.len > DHT_MAX_SUBKEY ||
        p->value.len > DHT_MAX_VALUE || p->author.len != 32 || p->signature.len != 64)
        return CM_EPARSE;
    memcpy(r->key, p->key.data, DHT_ID_LEN);
    memcpy(r->author, p->author.data, 32);
    memcpy(r->sig, p->signature.data, 64);
    r->expires_ms = p->expires_ms;
    struct dht_record src = *r;
    src.subkey = p->subkey.data;
    src.subkey_len = p->subkey.len;
    src.value = p->value.data;
    src.value_len = p->value.len;
    return dht_record_copy(r, &src);
}

static void record_to_pb(const struct dht_record *r, Ctp2p__Record *p)
{
    ctp2p__record__init(p);
    p->key.data = (uint8_t *)r->key;
    p->key.len = DHT_ID_LEN;
    p->subkey.data = r->subkey;
    p->subkey.len = r->subkey_len;
    p->value.data = r->value;
    p->value.len = r->value_len;
    p->expires_ms = r->expires_ms;
    p->author.data = (uint8_t *)r->author;
    p->author.len = 32;
    p->signature.data = (uint8_t *)r->sig;
    p->signature.len = 64;
}

static int records_from_pb(Ctp2p__Record **p, size_t n, size_t max, struct dht_msg_records *out)
{
    out->n = 0;
    out->rec = NULL;
    if (n > max)
        return CM_EPARSE;
    if (n && !(out->rec = calloc(n, sizeof *out->rec)))
        return CM_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = record_from_pb(p[i], &out->rec[i]);
        if (rc) {
            dht_msg_records_cleanup(out);
            return rc;
        }
        out->n++;
    }
    return CM_OK;
}

void dht_msg_records_cleanup(struct dht_msg_records *r)
{
    for (size_t i = 0; i < r->n; i++)
        dht_record_cleanup(&r->rec[i]);
    free(r->rec);
    r->rec = NULL;
    r->n = 0;
}

int dht_msg_parse_values(const uint8_t *buf, size_t len, struct dht_msg_values *out)
{
    memset(out, 0, sizeof *out);
    Ctp2p__Values *m = ctp2p__values__unpack(NULL, len, buf);
    if (!m)
        return CM_EPARSE;
    int rc = records_from_pb(m->records, m->n_records, DHT_MAX_VALUE_RECORDS, &out->r);
    if (!rc) {
        rc = nodes_from_pb(m->contacts, m->n_contacts, &out->nodes);
        if (rc)
            dht_msg_records_cleanup(&out->r);
    }
    ctp2p__values__free_unpacked(m, NULL);
    if (rc)
        out->nodes.n = 0;
    return rc;
}

void dht_msg_values_cleanup(struct dht_msg_values *v)
{
    dht_msg_records_cleanup(&v->r);
    v->nodes.n = 0;
}

int dht_msg_encode_values(const struct dht_record *const *rec, size_t nrec,
                          const struct dht_contact *c, size_t nc, size_t max_bytes, uint8_t **out,
                          size_t *len)
{
    struct pb_contacts pc;
    Ctp2p__Record pr[DHT_MAX_VALUE_RECORDS], *pp[DHT_MAX_VALUE_RECORDS];
    Ctp2p__Values m = CTP2P__VALUES__INIT;
    m.n_contacts = contacts_to_pb(c, nc, &pc);
    m.contacts = pc.p;
    m.records = pp;
    size_t budget = ctp2p__values__get_packed_size(&m);
    for (size_t i = 0; i < nrec && m.n_records < DHT_MAX_VALUE_RECORDS; i++) {
        record_to_pb(rec[i], &pr[m.n_records]);
        size_t sz = ctp2p__record__get_packed_size(&pr[m.n_records]) + 4;
        if (budget + sz > max_bytes)
            break;
        budget += sz;
        pp[m.n_records] = &pr[m.n_records];
        m.n_records++;
    }
    PACK_INTO(values, &m, out, len);
    return CM_OK;
}

int dht_msg_parse_store(const uint8_t *buf, size_t len, struct dht_msg_records *out)
{
    out->n = 0;
    out->rec = NULL;
    Ctp2p__Store *m = ctp2p__store__unpack(NULL, len, buf);
    if (!m)
        return CM_EPARSE;
    int rc = m->n_records == 0 ? CM_EPARSE
                               : records_from_pb(m->records, m->n_records,
                                                 DHT_MAX_STORE_RECORDS, out);
    ctp2p__store__free_unpacked(m, NULL);
    return rc;
}

int dht_msg_encode_store(const struct dht_record *const *rec, size_t n, uint8_t **out,
                         size_t *len)
{
    if (n == 0 || n > DHT_MAX_STORE_RECORDS)
        return CM_EINVAL;
    Ctp2p__Record pr[DHT_MAX_STORE_RECORDS], *pp[DHT_MAX_STORE_RECORDS];
    for (size_t i = 0; i < n; i++) {
        record_to_pb(rec[i], &pr[i]);
        pp[i] = &pr[i];
    }
    Ctp2p__Store m = CTP2P__STORE__INIT;
    m.n_records = n;
    m.records = pp;
    PACK_INTO(store, &m, out, len);
    return CM_OK;
}

int dht_msg_parse_store_result(const uint8_t *buf, size_t len, struct dht_msg_store_result *out)
{
    out->n = 0;
    Ctp2p__StoreResult *m = ctp2p__store_result__unpack(NULL, len, buf);
    if (!m)
        return CM_EPARSE;
    int rc = m->n_status <= DHT_MAX_STORE_RECORDS ? CM_OK : CM_EPARSE;
    for (size_t i = 0; !rc && i < m->n_status; i++) {
        if (m->status[i] > 0 || m->status[i] < -100000)
            rc = CM_EPARSE;
        else
            out->status[out->n++] = m->status[i];
    }
    ctp2p__store_result__free_unpacked(m, NULL);
    if (rc)
        out->n = 0;
    return rc;
}

int dht_msg_encode_store_result(const int32_t *status, size_t n, uint8_t **out, size_t *len)
{
    if (n > DHT_MAX_STORE_RECORDS)
        return CM_EINVAL;
    Ctp2p__StoreResult m = CTP2P__STORE_RESULT__INIT;
    m.n_status = n;
    m.status = (int32_t *)status;
    PACK_INTO(store_result, &m, out, len);
    return CM_OK;
}
