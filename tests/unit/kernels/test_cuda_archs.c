/* The GPU code in the binaries covers the GPUs volunteers own: SASS for
 * sm_75, sm_80, sm_86, sm_89 and sm_90 (and sm_70 when the nvcc that built
 * it still could: CUDA 13 dropped Volta), PTX for compute_90 so newer GPUs
 * JIT it, and exactly the lists the device check (kern_gpu.c) believes.
 *
 * Read from the ELF itself: the .nv_fatbin section holds fat binaries
 * (header: magic 0xBA55ED50, u16 version, u16 header size, u64 size of the
 * entries), each entry a header (u16 kind: 1 PTX, 2 ELF; u16 version; u32
 * header size; u64 payload size; the architecture as a u32 at offset 28)
 * and its payload. The layout is NVIDIA's undocumented fatbinary format, so
 * the reading is checked on the payloads: every ELF entry must be a CUDA
 * cubin (ELF magic, e_machine EM_CUDA = 190). Where cuobjdump is installed
 * (it is not part of the nvcc-only toolkit of the development machines),
 * `cuobjdump --list-elf` / `--list-ptx` must agree. Skipped (77) in builds
 * without CUDA. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_err.h"
#include "kern_backend.h"
#include "kern_gpu.h"

#define FATBIN_MAGIC 0xBA55ED50u
#define EM_CUDA 190

struct archs {
    int nsass, sass[64];
    int nptx, ptx[64];
};

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)rd16(p) | (uint32_t)rd16(p + 2) << 16; }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void add_unique(int *v, int *n, int x)
{
    for (int i = 0; i < *n; i++)
        if (v[i] == x)
            return;
    assert_true(*n < 64);
    v[(*n)++] = x;
}

/* Lists the architectures of every fat binary in an x86-64 ELF file. */
static void fatbin_archs(const char *path, struct archs *a)
{
    memset(a, 0, sizeof *a);
    size_t len = 0;
    uint8_t *d = read_file(path, &len);
    assert_non_null(d);
    assert_true(len > 64 && !memcmp(d, "\177ELF", 4) && d[4] == 2 /* ELFCLASS64 */);
    uint64_t shoff = rd64(d + 0x28);
    uint16_t shentsize = rd16(d + 0x3a), shnum = rd16(d + 0x3c), shstrndx = rd16(d + 0x3e);
    assert_true(shoff + (uint64_t)shnum * shentsize <= len && shstrndx < shnum);
    const uint8_t *strsh = d + shoff + (size_t)shstrndx * shentsize;
    uint64_t stroff = rd64(strsh + 0x18);
    size_t found = 0;
    for (int i = 0; i < shnum; i++) {
        const uint8_t *sh = d + shoff + (size_t)i * shentsize;
        const char *name = (const char *)d + stroff + rd32(sh);
        if (strcmp(name, ".nv_fatbin"))
            continue;
        uint64_t off = rd64(sh + 0x18), size = rd64(sh + 0x20);
        assert_true(off + size <= len);
        uint64_t p = off;
        while (p + 16 <= off + size) {
            if (rd32(d + p) != FATBIN_MAGIC) { /* padding between fat binaries */
                p += 8;
                continue;
            }
            uint16_t hsize = rd16(d + p + 6);
            uint64_t fsize = rd64(d + p + 8), e = p + hsize, end = p + hsize + fsize;
            assert_true(end <= off + size);
            while (e + 32 <= end) {
                uint16_t kind = rd16(d + e);
                uint32_t ehsize = rd32(d + e + 4), arch = rd32(d + e + 28);
                uint64_t psize = rd64(d + e + 8);
                assert_true(e + ehsize + psize <= end);
                const uint8_t *pl = d + e + ehsize;
                if (kind == 2) {
                    if (memcmp(pl, "\177ELF", 4) || rd16(pl + 18) != EM_CUDA) {
                        print_error("%s: fatbin ELF entry for %u is not a cubin\n", path, arch);
                        fail();
                    }
                    add_unique(a->sass, &a->nsass, (int)arch);
                } else if (kind == 1) {
                    add_unique(a->ptx, &a->nptx, (int)arch);
                } else {
                    print_error("%s: fatbin entry of unknown kind %u\n", path, kind);
                    fail();
                }
                found++;
                e += ehsize + psize;
            }
            p = end;
        }
    }
    free(d);
    print_message("  %s: %zu fatbin entries; SASS", path, found);
    for (int i = 0; i < a->nsass; i++)
        print_message(" sm_%d", a->sass[i]);
    print_message("; PTX");
    for (int i = 0; i < a->nptx; i++)
        print_message(" compute_%d", a->ptx[i]);
    print_message("\n");
}

static int has(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

static void check_binary(const char *path, const struct kern_cuda_build *b)
{
    struct archs a;
    fatbin_archs(path, &a);
    /* what the volunteers' GPUs need */
    static const int need[] = {75, 80, 86, 89, 90};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!has(a.sass, a.nsass, need[i])) {
            print_error("%s: no sm_%d code\n", path, need[i]);
            fail();
        }
    if (b->toolkit < 13000 && !has(a.sass, a.nsass, 70)) {
        print_error("%s: no sm_70 code, and CUDA %d can build it\n", path, b->toolkit);
        fail();
    }
    if (!has(a.ptx, a.nptx, 90)) {
        print_error("%s: no compute_90 PTX for GPUs newer than sm_90\n", path);
        fail();
    }
    /* and exactly what the device check believes */
    assert_int_equal(a.nsass, b->nsass);
    for (int i = 0; i < b->nsass; i++)
        assert_true(has(a.sass, a.nsass, b->sass[i]));
    assert_int_equal(a.nptx, 1);
    assert_int_equal(a.ptx[0], b->ptx);
}

/* cuobjdump's listing, where the tool exists: each architecture named. */
static void check_with_cuobjdump(const char *path, const struct kern_cuda_build *b)
{
    const char *tool = NULL;
    static const char *cands[] = {"/usr/local/cuda/bin/cuobjdump", "/usr/bin/cuobjdump"};
    for (size_t i = 0; i < 2 && !tool; i++)
        if (access(cands[i], X_OK) == 0)
            tool = cands[i];
    if (!tool) {
        print_message("  cuobjdump is not installed here: the fatbin was read directly only\n");
        return;
    }
    char cmd[1200], out[8192];
    snprintf(cmd, sizeof cmd, "%s --list-elf --list-ptx '%s' 2>&1", tool, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    pclose(p);
    print_message("  %s:\n%s", cmd, out);
    for (int i = 0; i < b->nsass; i++) {
        char want[32];
        snprintf(want, sizeof want, ".sm_%d.cubin", b->sass[i]);
        assert_non_null(strstr(out, want));
    }
    char want[32];
    snprintf(want, sizeof want, ".sm_%d.ptx", b->ptx);
    assert_non_null(strstr(out, want));
}

static void test_binaries_carry_every_arch(void **state)
{
    (void)state;
    struct kern_gpu_facts f;
    struct kern_cuda_build b;
    int real;
    char err[256] = "";
    unsetenv("CROWDTRAIN_FAKE_GPU");
    assert_int_equal(kern_gpu_facts_gather(&f, &b, &real, err, sizeof err), CM_OK);
    print_message("  built by CUDA %d.%d for", b.toolkit / 1000, b.toolkit % 1000 / 10);
    for (int i = 0; i < b.nsass; i++)
        print_message(" sm_%d", b.sass[i]);
    print_message(" + compute_%d PTX\n", b.ptx);

    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = 0;
    check_binary(self, &b);

    /* build/tests/unit/kernels/<this> -> build/bin/crowdtrain-agent */
    char dir[1024], agent[1100];
    snprintf(dir, sizeof dir, "%s", self);
    snprintf(agent, sizeof agent, "%s/../../../bin/crowdtrain-agent", dirname(dir));
    if (access(agent, R_OK) == 0) {
        check_binary(agent, &b);
        check_with_cuobjdump(agent, &b);
    } else {
        print_message("  NOTE: %s is not built; only this test binary (same libct_kernels.a) was "
                      "checked\n", agent);
        check_with_cuobjdump(self, &b);
    }
}

int main(void)
{
    if (!kern_have_cuda_build()) {
        printf("skipped: this build has no CUDA backend (CUDA=0, no nvcc, or the sanitizer "
               "build)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binaries_carry_every_arch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
