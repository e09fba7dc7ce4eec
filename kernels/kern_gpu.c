/* The GPU check (kern_gpu.h): can this build run on device 0, with this
 * driver, for this model? Pure functions over struct kern_gpu_facts and
 * struct kern_cuda_build; the facts come from kernels/cuda/kern_cuda.cu or,
 * in tests, from CROWDTRAIN_FAKE_GPU. The compatibility rules are CUDA's
 * (CUDA C++ Programming Guide, "Binary Compatibility" and "Application
 * Compatibility"): a cubin for sm_XY runs on capability X.Z with Z >= Y and
 * no other major; PTX for compute_XY is compiled by the driver for any
 * capability >= X.Y, by a driver at least as new as the PTX; a runtime of
 * CUDA major M needs a driver of major >= M (minor version compatibility
 * inside a major). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_gpu.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

size_t kern_mem_need_total(const struct kern_mem_need *n)
{
    return n->params + n->grads + n->optim + n->act + n->scratch + n->reserve;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int kern_cuda_build_parse(const char *sass_list, int ptx, int toolkit, struct kern_cuda_build *b)
{
    memset(b, 0, sizeof *b);
    if (!sass_list || ptx < 0 || ptx > 999)
        return CM_EINVAL;
    const char *p = sass_list;
    while (*p) {
        if (*p == ' ') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 10 || v > 999 || (*end && *end != ' ') ||
            b->nsass == KERN_GPU_MAX_ARCHS)
            return CM_EINVAL;
        b->sass[b->nsass++] = (int)v;
        p = end;
    }
    if (b->nsass == 0 && ptx == 0)
        return CM_EINVAL;
    qsort(b->sass, (size_t)b->nsass, sizeof b->sass[0], cmp_int);
    b->have = 1;
    b->ptx = ptx;
    b->toolkit = toolkit;
    return CM_OK;
}

int kern_gpu_arch_runs(const struct kern_cuda_build *b, int cc, int *via_ptx)
{
    *via_ptx = 0;
    for (int i = 0; i < b->nsass; i++)
        if (b->sass[i] / 10 == cc / 10 && b->sass[i] % 10 <= cc % 10)
            return 1;
    if (b->ptx && b->ptx <= cc) {
        *via_ptx = 1;
        return 1;
    }
    return 0;
}

/* The lowest architecture the build has code for. */
static int lowest_arch(const struct kern_cuda_build *b)
{
    int lo = b->nsass ? b->sass[0] : b->ptx;
    return b->ptx && b->ptx < lo ? b->ptx : lo;
}

static void arch_list(const struct kern_cuda_build *b, char *out, size_t len)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < b->nsass && n < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%ssm_%d", i ? ", " : "", b->sass[i]);
    if (b->ptx && n < len)
        snprintf(out + n, len - n, "%sPTX compute_%d", b->nsass ? " and " : "", b->ptx);
}

static const char *driver_for(int cuda_major)
{
    /* the first driver branch of each CUDA major (CUDA Toolkit release
     * notes, table 3, "minimum required driver version") */
    switch (cuda_major) {
    case 11: return " (driver 450 or newer)";
    case 12: return " (driver 525 or newer)";
    case 13: return " (driver 580 or newer)";
    default: return "";
    }
}

int kern_gpu_check(const struct kern_gpu_facts *f, const struct kern_cuda_build *b,
                   const struct kern_mem_need *need, char *msg, size_t msglen)
{
    if (!b->have) {
        snprintf(msg, msglen, "cuda: this build has no CUDA backend (built with CUDA=0 or without nvcc)");
        return CM_EUNSUPPORTED;
    }
    if (f->driver <= 0) {
        snprintf(msg, msglen, "cuda: no NVIDIA driver found%s%s%s", f->error[0] ? " (" : "",
                 f->error, f->error[0] ? ")" : "");
        return CM_EDEVICE;
    }
    if (f->driver / 1000 < f->runtime / 1000) {
        snprintf(msg, msglen,
                 "cuda: the NVIDIA driver supports CUDA %d.%d; this build's CUDA %d.%d runtime "
                 "needs a driver for CUDA %d%s",
                 f->driver / 1000, f->driver % 1000 / 10, f->runtime / 1000,
                 f->runtime % 1000 / 10, f->runtime / 1000, driver_for(f->runtime / 1000));
        return CM_EDEVICE;
    }
    if (f->ndev <= 0) {
        snprintf(msg, msglen, "cuda: no GPU found%s%s%s", f->error[0] ? " (" : "", f->error,
                 f->error[0] ? ")" : "");
        return CM_EDEVICE;
    }
    int cc = f->cc_major * 10 + f->cc_minor, via_ptx = 0;
    if (!kern_gpu_arch_runs(b, cc, &via_ptx)) {
        /* below the lowest architecture, the lower bound is the answer; the
         * default lists (kernels/module.mk) leave no gap above it, the PTX
         * covering what is newer than the SASS */
        int lo = lowest_arch(b);
        if (cc < lo && b->ptx)
            snprintf(msg, msglen, "cuda: %s is sm_%d; this build runs sm_%d and newer", f->name,
                     cc, lo);
        else {
            char list[160];
            arch_list(b, list, sizeof list);
            snprintf(msg, msglen, "cuda: %s is sm_%d; this build has code for %s only", f->name,
                     cc, list);
        }
        return CM_EDEVICE;
    }
    if (via_ptx && f->driver < b->toolkit) {
        snprintf(msg, msglen,
                 "cuda: %s is sm_%d, which this build reaches only through its compute_%d PTX "
                 "from CUDA %d.%d, and the driver (CUDA %d.%d) is too old to compile it: it "
                 "needs a driver for CUDA %d.%d or newer",
                 f->name, cc, b->ptx, b->toolkit / 1000, b->toolkit % 1000 / 10, f->driver / 1000,
                 f->driver % 1000 / 10, b->toolkit / 1000, b->toolkit % 1000 / 10);
        return CM_EDEVICE;
    }
    if (f->image == 0) {
        snprintf(msg, msglen, "cuda: %s (sm_%d): none of this build's GPU code loads on it", f->name,
                 cc);
        return CM_EDEVICE;
    }
    if (need && kern_mem_need_total(need) > f->mem_free) {
        snprintf(msg, msglen,
                 "cuda: %s has %.1f GiB free of %.1f GiB; this model needs about %.1f GiB "
                 "(parameters %.2f + gradients %.2f + optimizer %.2f + activations %.2f + "
                 "scratch %.2f + reserve %.2f)",
                 f->name, f->mem_free / GIB, f->mem_total / GIB, kern_mem_need_total(need) / GIB,
                 need->params / GIB, need->grads / GIB, need->optim / GIB, need->act / GIB,
                 need->scratch / GIB, need->reserve / GIB);
        return CM_ENOMEM;
    }
    int n = snprintf(msg, msglen, "cuda: %s (sm_%d%s, %.1f GiB free of %.1f GiB, driver CUDA %d.%d)",
                     f->name, cc, via_ptx ? " through the PTX, compiled by the driver at start" : "",
                     f->mem_free / GIB, f->mem_total / GIB, f->driver / 1000,
                     f->driver % 1000 / 10);
    if (need && n > 0 && (size_t)n < msglen)
        snprintf(msg + n, msglen - (size_t)n, "; the model needs about %.2f GiB",
                 kern_mem_need_total(need) / GIB);
    return CM_OK;
}

const char *kern_gpu_precision(int cc, const char *mode)
{
    if (cc < 80 && (!strcmp(mode, "bf16") || !strcmp(mode, "tf32")))
        return "fp32";
    return mode;
}

/* "X.Y" -> 1000 X + 10 Y (a CUDA version) or 10 X + Y (a capability when
 * scale is 10); -1 on anything else. */
static long parse_version(const char *s, size_t len, int major_scale)
{
    char buf[16];
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *end;
    errno = 0;
    long maj = strtol(buf, &end, 10);
    if (end == buf || errno || maj < 0 || maj > 99 || *end != '.')
        return -1;
    char *p = end + 1;
    long min = strtol(p, &end, 10);
    if (end == p || errno || *end || min < 0 || min > 9)
        return -1;
    return major_scale == 10 ? maj * 10 + min : maj * 1000 + min * 10;
}

static int parse_size(const char *s, size_t len, size_t *out)
{
    char buf[32];
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (end == buf || errno || v < 0)
        return -1;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1024.0 * 1024; end++; break;
    case 'G': mul = GIB; end++; break;
    case 'T': mul = GIB * 1024; end++; break;
    default: return -1;
    }
    if (*end || v * mul > 1e18)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int bad(char *err, size_t errlen, const char *what, const char *s, size_t len)
{
    snprintf(err, errlen, "CROWDTRAIN_FAKE_GPU: %s '%.*s'", what, (int)len, s);
    return CM_EINVAL;
}

int kern_gpu_facts_parse(const char *spec, int default_runtime, struct kern_gpu_facts *out,
                         char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->fake = 1;
    out->image = -1;
    out->driver = out->runtime = default_runtime;
    if (!spec || !*spec)
        return bad(err, errlen, "empty", "", 0);
    if (!strcmp(spec, "nodriver")) {
        out->driver = 0;
        snprintf(out->error, sizeof out->error, "faked: nodriver");
        return CM_OK;
    }
    if (!strcmp(spec, "none")) {
        snprintf(out->error, sizeof out->error, "faked: none");
        return CM_OK;
    }
    const char *comma = strchr(spec, ',');
    size_t nlen = comma ? (size_t)(comma - spec) : strlen(spec);
    if (nlen == 0 || nlen >= sizeof out->name)
        return bad(err, errlen, "bad device name", spec, nlen);
    memcpy(out->name, spec, nlen);
    out->ndev = 1;
    int have_cc = 0, have_mem = 0, have_free = 0;
    const char *p = comma;
    while (p && *p == ',') {
        p++;
        const char *next = strchr(p, ',');
        size_t len = next ? (size_t)(next - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (!eq)
            return bad(err, errlen, "expected key=value, got", p, len);
        size_t klen = (size_t)(eq - p), vlen = len - klen - 1;
        const char *v = eq + 1;
        long x;
        if (klen == 2 && !memcmp(p, "cc", 2)) {
            if ((x = parse_version(v, vlen, 10)) < 10)
                return bad(err, errlen, "bad cc (want M.m)", v, vlen);
            out->cc_major = (int)(x / 10);
            out->cc_minor = (int)(x % 10);
            have_cc = 1;
        } else if (klen == 3 && !memcmp(p, "mem", 3)) {
            if (parse_size(v, vlen, &out->mem_total))
                return bad(err, errlen, "bad mem", v, vlen);
            have_mem = 1;
        } else if (klen == 4 && !memcmp(p, "free", 4)) {
            if (parse_size(v, vlen, &out->mem_free))
                return bad(err, errlen, "bad free", v, vlen);
            have_free = 1;
        } else if (klen == 6 && !memcmp(p, "driver", 6)) {
            if ((x = parse_version(v, vlen, 1000)) < 0)
                return bad(err, errlen, "bad driver (want X.Y)", v, vlen);
            out->driver = (int)x;
        } else if (klen == 7 && !memcmp(p, "runtime", 7)) {
            if ((x = parse_version(v, vlen, 1000)) < 0)
                return bad(err, errlen, "bad runtime (want X.Y)", v, vlen);
            out->runtime = (int)x;
        } else {
            return bad(err, errlen, "unknown key", p, klen);
        }
        p = next;
    }
    if (!have_cc || !have_mem)
        return bad(err, errlen, "needs cc= and mem=, got", spec, strlen(spec));
    if (!have_free)
        out->mem_free = out->mem_total;
    if (out->mem_free > out->mem_total)
        return bad(err, errlen, "free above mem", spec, strlen(spec));
    return CM_OK;
}
