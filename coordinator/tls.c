/* Self-signed certificate generation with OpenSSL (see tls.h). */
#include "coordinator/tls.h"
#include "cm_err.h"
#include "cm_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/bn.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int read_file(const char *path, char **out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? CM_ENOTFOUND : CM_EIO;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    char tmp[4096];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb || cap > (1u << 20)) {
                free(nb ? nb : buf);
                fclose(f);
                return nb ? CM_ETOOBIG : CM_ENOMEM;
            }
            buf = nb;
        }
        memcpy(buf + len, tmp, n);
        len += n;
    }
    fclose(f);
    if (!buf)
        return CM_EPARSE;
    buf[len] = '\0';
    *out = buf;
    return CM_OK;
}

static int write_atomic(const char *path, const char *data, mode_t mode)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        return CM_EIO;
    size_t len = strlen(data), off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w <= 0) {
            close(fd);
            unlink(tmp);
            return CM_EIO;
        }
        off += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return CM_EIO;
    }
    return CM_OK;
}

static char *bio_text(BIO *b)
{
    char *p = NULL;
    long n = BIO_get_mem_data(b, &p);
    char *s = malloc((size_t)n + 1);
    if (s) {
        memcpy(s, p, (size_t)n);
        s[n] = '\0';
    }
    return s;
}

/* Names every self-signed certificate covers anyway; 0.0.0.0 and :: are
 * "any address", not a host. */
static int is_builtin_host(const char *h)
{
    return !strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !strcmp(h, "127.0.0.1") || !strcmp(h, "::1") ||
           !strcmp(h, "localhost");
}

/* Whether the certificate verifies for host (an IP or a DNS name). */
static int cert_covers(const char *cert_pem, const char *host)
{
    BIO *b = BIO_new_mem_buf(cert_pem, -1);
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    unsigned char a[16];
    int ip = inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
    int ok = x && (ip ? X509_check_ip_asc(x, host, 0) : X509_check_host(x, host, 0, 0, NULL)) == 1;
    X509_free(x);
    BIO_free(b);
    return ok;
}

static int generate(const char *const *hosts, size_t nhosts, char **cert_pem, char **key_pem)
{
    int rc = CM_ECRYPTO;
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    BIO *bc = BIO_new(BIO_s_mem()), *bk = BIO_new(BIO_s_mem());
    if (!key || !x || !bc || !bk)
        goto out;
    X509_set_version(x, 2);
    unsigned char serial[16];
    if (RAND_bytes(serial, sizeof serial) != 1)
        goto out;
    serial[0] &= 0x7f;
    BIGNUM *bn = BN_bin2bn(serial, sizeof serial, NULL);
    BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
    BN_free(bn);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 825L * 24 * 3600);
    X509_set_pubkey(x, key);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"Crowdtrain", -1, -1, 0);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"crowdtrain-coordinator", -1, -1, 0);
    X509_set_issuer_name(x, name);
    char san[1024];
    size_t off = (size_t)snprintf(san, sizeof san, "DNS:localhost,IP:127.0.0.1,IP:::1");
    for (size_t i = 0; i < nhosts; i++) {
        if (!hosts[i] || !*hosts[i] || is_builtin_host(hosts[i]) || off >= sizeof san)
            continue;
        unsigned char a[16];
        int ip = inet_pton(AF_INET, hosts[i], a) == 1 || inet_pton(AF_INET6, hosts[i], a) == 1;
        off += (size_t)snprintf(san + off, sizeof san - off, ",%s:%s", ip ? "IP" : "DNS", hosts[i]);
    }
    if (off >= sizeof san)
        goto out;
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
    const char *exts[][2] = {{"subjectAltName", san},
                             {"basicConstraints", "critical,CA:TRUE"},
                             {"keyUsage", "critical,digitalSignature,keyCertSign"},
                             {"extendedKeyUsage", "serverAuth"}};
    for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
        X509_EXTENSION *e = X509V3_EXT_conf(NULL, &ctx, exts[i][0], exts[i][1]);
        if (!e)
            goto out;
        X509_add_ext(x, e, -1);
        X509_EXTENSION_free(e);
    }
    if (!X509_sign(x, key, EVP_sha256()))
        goto out;
    if (PEM_write_bio_X509(bc, x) != 1 || PEM_write_bio_PrivateKey(bk, key, NULL, NULL, 0, NULL, NULL) != 1)
        goto out;
    *cert_pem = bio_text(bc);
    *key_pem = bio_text(bk);
    rc = *cert_pem && *key_pem ? CM_OK : CM_ENOMEM;
out:
    BIO_free(bc);
    BIO_free(bk);
    X509_free(x);
    EVP_PKEY_free(key);
    return rc;
}

int coord_tls_load(const char *cert_path, const char *key_path, const char *data_dir,
                   const char *const *hosts, size_t nhosts, char **cert_pem, char **key_pem)
{
    *cert_pem = *key_pem = NULL;
    char cp[4096], kp[4096];
    if (cert_path || key_path) {
        if (!cert_path || !key_path) {
            CM_LOGE("tls", "--tls-cert and --tls-key go together");
            return CM_EINVAL;
        }
        int rc = read_file(cert_path, cert_pem);
        if (rc == CM_OK)
            rc = read_file(key_path, key_pem);
        if (rc != CM_OK) {
            CM_LOGE("tls", "reading %s / %s: %s", cert_path, key_path, cm_strerror(rc));
            free(*cert_pem);
            *cert_pem = NULL;
        }
        return rc;
    }
    snprintf(cp, sizeof cp, "%s/tls-cert.pem", data_dir);
    snprintf(kp, sizeof kp, "%s/tls-key.pem", data_dir);
    int rc = read_file(cp, cert_pem);
    if (rc == CM_OK) {
        rc = read_file(kp, key_pem);
        if (rc != CM_OK) {
            CM_LOGE("tls", "%s exists but %s cannot be read: %s", cp, kp, cm_strerror(rc));
            free(*cert_pem);
            *cert_pem = NULL;
            return rc;
        }
        /* Our own certificate from an earlier start: agents could not verify
           it for a host it does not name (a new --public-url), so make a new
           one that names every host. */
        const char *missing = NULL;
        for (size_t i = 0; i < nhosts && !missing; i++)
            if (hosts[i] && *hosts[i] && !is_builtin_host(hosts[i]) && !cert_covers(*cert_pem, hosts[i]))
                missing = hosts[i];
        if (!missing)
            return CM_OK;
        CM_LOGW("tls", "%s does not name %s: generating a new self-signed certificate (agents need the "
                "new file for --ca-cert)", cp, missing);
        free(*cert_pem);
        free(*key_pem);
        *cert_pem = *key_pem = NULL;
    } else if (rc != CM_ENOTFOUND) {
        return rc;
    }
    rc = generate(hosts, nhosts, cert_pem, key_pem);
    if (rc != CM_OK)
        return rc;
    /* Key first, and an old certificate gone before: a crash in between
     * leaves no certificate, and the next start generates a fresh pair
     * instead of pairing a certificate with another key. */
    if (unlink(cp) != 0 && errno != ENOENT)
        rc = CM_EIO;
    else if ((rc = write_atomic(kp, *key_pem, 0600)) == CM_OK)
        rc = write_atomic(cp, *cert_pem, 0644);
    if (rc != CM_OK) {
        CM_LOGE("tls", "writing the self-signed certificate into %s failed", data_dir);
        free(*cert_pem);
        free(*key_pem);
        *cert_pem = *key_pem = NULL;
        return rc;
    }
    CM_LOGI("tls", "generated a self-signed certificate: %s (agents: --ca-cert %s)", cp, cp);
    return CM_OK;
}
