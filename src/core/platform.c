/*
 * platform.c - what machine we decide for: CPU features read with CPUID and
 * confirmed with XGETBV (the OS must save the registers, or the instructions
 * fault), AMX permission asked of the kernel, and the simulated platforms
 * that tests and `sdpa explain --platform` describe.
 */
#define _GNU_SOURCE
#include "core.h"
#include "cpu_features.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define SDPA_X86 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#ifdef SDPA_X86
static int real_cpuid(unsigned leaf, unsigned sub, unsigned r[4])
{
    unsigned max = __get_cpuid_max(leaf & 0x80000000u, NULL);
    if (max == 0 || leaf > max)
        return 0;
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    return 1;
}

static uint64_t real_xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Asks Linux for the AMX tile-data state (needed once per process since
 * 5.16; without it the first tile instruction kills the process). */
static int real_request_amx(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    unsigned long bits = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) == 0 &&
        (bits & (1ul << XFEATURE_XTILEDATA)))
        return 1;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return 0;
    bits = 0;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) == 0 &&
           (bits & (1ul << XFEATURE_XTILEDATA));
#else
    return 0;
#endif
}

static const sdpa_cpu_probe real_probe = {real_cpuid, real_xgetbv0, real_request_amx};
static const sdpa_cpu_probe *cpu_probe = &real_probe;

void sdpa__set_cpu_probe(const sdpa_cpu_probe *probe)
{
    cpu_probe = probe ? probe : &real_probe;
}

static void detect_x86(sdpa_platform *p)
{
    const sdpa_cpu_probe *io = cpu_probe;
    unsigned r[4];
    unsigned brand[12] = {0};
    if (io->cpuid(0x80000000u, 0, r) && r[0] >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++)
            io->cpuid(0x80000002u + i, 0, &brand[4 * i]);
        char tmp[49];
        memcpy(tmp, brand, 48);
        tmp[48] = '\0';
        const char *s = tmp;
        while (*s == ' ')
            s++;
        if (*s)
            sdpa__strlcpy(p->cpu_model, s, sizeof p->cpu_model);
    }
    if (io->cpuid(0, 0, r)) { /* the vendor: "GenuineIntel", "AuthenticAMD" in EBX EDX ECX */
        char v[13];
        memcpy(v, &r[1], 4), memcpy(v + 4, &r[3], 4), memcpy(v + 8, &r[2], 4);
        v[12] = '\0';
        sdpa__strlcpy(p->cpu_vendor,
                      strcmp(v, "GenuineIntel") == 0   ? "intel"
                      : strcmp(v, "AuthenticAMD") == 0 ? "amd"
                                                       : "other",
                      sizeof p->cpu_vendor);
    }
    if (!io->cpuid(1, 0, r))
        return;
    const unsigned base_family = (r[0] >> 8) & 0xf;
    p->cpu_family = (int)(base_family == 0xf ? base_family + ((r[0] >> 20) & 0xff) : base_family);
    const unsigned c1 = r[2];
    int fma = (c1 >> 12) & 1, osxsave = (c1 >> 27) & 1, avx = (c1 >> 28) & 1,
        f16c = (c1 >> 29) & 1;
    unsigned b7 = 0, d7 = 0, a71 = 0;
    if (io->cpuid(7, 0, r)) {
        b7 = r[1], d7 = r[3];
        if (r[0] >= 1 && io->cpuid(7, 1, r))
            a71 = r[0];
    }
    unsigned present = 0;
    if (avx && fma && f16c && ((b7 >> 5) & 1))
        present |= SDPA_CPU_AVX2;
    if (((b7 >> 16) & 1) && ((b7 >> 17) & 1) && ((b7 >> 30) & 1) && ((b7 >> 31) & 1))
        present |= SDPA_CPU_AVX512F;
    if ((present & SDPA_CPU_AVX512F) && ((a71 >> 5) & 1))
        present |= SDPA_CPU_AVX512BF16;
    if ((present & SDPA_CPU_AVX512F) && ((d7 >> 23) & 1))
        present |= SDPA_CPU_AVX512FP16;
    if (((d7 >> 22) & 1) && ((d7 >> 24) & 1))
        present |= SDPA_CPU_AMX_BF16;
    p->cpu_features_present = present;

    uint64_t xcr0 = osxsave ? io->xgetbv0() : 0;
    unsigned usable = present;
    if ((xcr0 & 0x6) != 0x6)
        usable &= ~(unsigned)(SDPA_CPU_AVX2 | SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16 |
                              SDPA_CPU_AVX512FP16 | SDPA_CPU_AMX_BF16);
    if ((xcr0 & 0xe0) != 0xe0)
        usable &= ~(unsigned)(SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16 | SDPA_CPU_AVX512FP16);
    if ((usable & SDPA_CPU_AMX_BF16) && (xcr0 & (3ull << 17)) == (3ull << 17))
        p->amx_permitted = io->request_amx();
    if (!p->amx_permitted)
        usable &= ~(unsigned)SDPA_CPU_AMX_BF16;
    p->cpu_features = usable;
}
#else
void sdpa__set_cpu_probe(const sdpa_cpu_probe *probe)
{
    (void)probe;
}
#endif

/* The first line of dir/file into buf (n bytes), 1; 0 where unreadable. */
static int read_first_line(const char *dir, const char *file, char *buf, size_t n)
{
    char path[4096 + 32]; /* dir (below 4096) and a file name */
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    const int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    return ok;
}

/* q / p of one cgroup directory, rounded up; 0 where it sets no limit or
 * cannot be read. v2: "cpu.max" holds "QUOTA PERIOD" or "max PERIOD";
 * v1: cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us. */
static int cgroup_dir_cpus(const char *dir, int v2)
{
    char q[64], p[64];
    long long quota = 0, period = 0;
    if (v2) {
        if (!read_first_line(dir, "cpu.max", q, sizeof q) ||
            sscanf(q, "%lld %lld", &quota, &period) != 2) /* "max ...": no number */
            return 0;
    } else if (!read_first_line(dir, "cpu.cfs_quota_us", q, sizeof q) ||
               !read_first_line(dir, "cpu.cfs_period_us", p, sizeof p) ||
               sscanf(q, "%lld", &quota) != 1 || sscanf(p, "%lld", &period) != 1) {
        return 0;
    }
    if (quota <= 0 || period <= 0)
        return 0;
    const long long cpus = (quota + period - 1) / period;
    return cpus > 4096 ? 4096 : (int)cpus;
}

int sdpa__cgroup_cpus(const char *root, const char *self_cgroup)
{
    FILE *f = fopen(self_cgroup, "r");
    if (!f)
        return 0;
    int best = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        /* "ID:CONTROLLERS:PATH": v2 has ID 0 and no controllers, v1's
         * CPU line names "cpu" among its controllers ("cpu,cpuacct") */
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = '\0', *c2 = '\0';
        const char *controllers = c1 + 1, *cg = c2 + 1;
        const int v2 = strcmp(line, "0") == 0 && controllers[0] == '\0';
        int v1 = 0;
        for (const char *t = controllers; !v2 && *t;) {
            const size_t n = strcspn(t, ",");
            v1 |= n == 3 && strncmp(t, "cpu", 3) == 0;
            t += n + (t[n] == ',');
        }
        if (!v2 && !v1)
            continue;
        /* the process's group and every group above it, each of which may
         * hold a quota (a container's root is its own "/") */
        char dir[4096];
        const int base = v2 ? snprintf(dir, sizeof dir, "%s", root)
                            : snprintf(dir, sizeof dir, "%s/%s", root, controllers);
        if (base < 0 || (size_t)base >= sizeof dir)
            continue;
        snprintf(dir + base, sizeof dir - (size_t)base, "%s", strcmp(cg, "/") ? cg : "");
        for (;;) {
            const int n = cgroup_dir_cpus(dir, v2);
            if (n > 0 && (best == 0 || n < best))
                best = n;
            char *slash = strrchr(dir + base, '/');
            if (!slash)
                break;
            *slash = '\0';
        }
    }
    fclose(f);
    return best;
}

int sdpa__cpus_allowed(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n = online > 0 ? (int)online : 1;
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 &&
        CPU_COUNT(&set) < n)
        n = CPU_COUNT(&set);
    const int quota = sdpa__cgroup_cpus("/sys/fs/cgroup", "/proc/self/cgroup");
    if (quota > 0 && quota < n)
        n = quota;
#endif
    return n;
}

size_t sdpa__cpu_l2_bytes(void)
{
    /* -1: not read yet; the same value whichever thread reads it first */
    static _Atomic long cached = -1;
    long b = atomic_load_explicit(&cached, memory_order_relaxed);
    if (b < 0) {
#ifdef _SC_LEVEL2_CACHE_SIZE
        b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        b = b > 0 ? b : 0;
        atomic_store_explicit(&cached, b, memory_order_relaxed);
    }
    return (size_t)b;
}

static void detect_cpu(sdpa_platform *p)
{
    sdpa__strlcpy(p->cpu_model, "unknown CPU", sizeof p->cpu_model);
    sdpa__strlcpy(p->cpu_arch, sdpa__build_arch(), sizeof p->cpu_arch);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    p->cpu_cores = n > 0 ? (int)n : 1;
#ifdef SDPA_X86
    detect_x86(p);
#elif defined(__aarch64__)
    /* Advanced SIMD (NEON) is part of every AArch64 core: no probe. */
    sdpa__strlcpy(p->cpu_model, SDPA_ARCH_AARCH64 " CPU", sizeof p->cpu_model);
    sdpa__strlcpy(p->cpu_vendor, "other", sizeof p->cpu_vendor);
    p->cpu_features = p->cpu_features_present = SDPA_CPU_NEON;
#endif
}

sdpa_status sdpa__platform_detect(sdpa_platform *out, void (*probe_cuda)(sdpa_platform *p))
{
    if (!out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "out is NULL, expected a platform to fill");
    memset(out, 0, sizeof *out);
    detect_cpu(out);
    if (probe_cuda)
        probe_cuda(out); /* fills the CUDA fields, or cuda_why */
    else
        sdpa__strlcpy(out->cuda_why, "not probed", sizeof out->cuda_why);
    return SDPA_OK;
}

/* Parses "sm_100", "sm_90a", "sm_86" into major/minor. */
static int parse_sm(const char *s, int *major, int *minor)
{
    if (strncmp(s, "sm_", 3) != 0)
        return 0;
    char *end;
    long n = strtol(s + 3, &end, 10);
    if (end == s + 3 || n < 10 || n > 999 || (*end && strcmp(end, "a") != 0 && strcmp(end, "f")))
        return 0;
    *major = (int)(n / 10), *minor = (int)(n % 10);
    return 1;
}

sdpa_status sdpa_platform_parse(const char *spec, sdpa_platform *out)
{
    if (!spec || !out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL", spec ? "out" : "spec");
    sdpa_platform p; /* this machine's CPU; the CUDA side is what spec says */
    sdpa__platform_detect(&p, NULL);
    sdpa__fmt(p.cuda_why, sizeof p.cuda_why, "platform '%.60s' describes no CUDA device", spec);
    char buf[256];
    if (strlen(spec) >= sizeof buf)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "platform '%.40s...' is too long", spec);
    strcpy(buf, spec);
    char *rest = strchr(buf, ':');
    if (rest)
        *rest++ = '\0';
    p.simulated = 1;
    if (strcmp(buf, "cpu") == 0) {
        char *save = NULL;
        const char *vendor = NULL;
        long family = -1;
        for (char *tok = rest ? strtok_r(rest, ",", &save) : NULL; tok;
             tok = strtok_r(NULL, ",", &save)) {
            if (strncmp(tok, "vendor=", 7) == 0) {
                vendor = tok + 7;
                if (strcmp(vendor, "intel") && strcmp(vendor, "amd") && strcmp(vendor, "other"))
                    return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                      "platform '%s': vendor '%s' unknown, expected intel, amd "
                                      "or other",
                                      spec, vendor);
            } else if (strncmp(tok, "family=", 7) == 0) {
                char *end;
                family = strtol(tok + 7, &end, 10);
                if (*end || end == tok + 7 || family < 1 || family > 255)
                    return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                      "platform '%s': family '%s' is not a CPUID display family "
                                      "1..255 (e.g. 25: AMD Zen 3 and Zen 4, 26: Zen 5, 6: "
                                      "Intel cores)",
                                      spec, tok + 7);
            } else if (strncmp(tok, "isa=", 4) == 0) {
                const sdpa_isa_level *level = sdpa__isa_level(tok + 4);
                char names[128];
                if (!level)
                    return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                      "platform '%s': isa '%s' unknown, expected %s", spec,
                                      tok + 4, sdpa__isa_levels_expected(names, sizeof names));
                p.cpu_features &= level->features;
            } else if (strncmp(tok, "features=", 9) == 0) {
                /* A described CPU: exactly these features, whatever this
                 * machine has, so explain shows what an AMX Xeon would run
                 * from a laptop. Kernels still run only where present. */
                char names[128];
                const char *bad = "";
                unsigned bits;
                if (!sdpa__cpu_features_parse(tok + 9, "+", &bits, &bad))
                    return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                      "platform '%s': feature '%s' unknown, expected a '+' list "
                                      "of %s",
                                      spec, bad, sdpa__cpu_features_expected(names, sizeof names));
                p.cpu_features = p.cpu_features_present = bits;
                /* the architecture the features belong to (neon: aarch64) */
                const char *arch = sdpa__cpu_features_arch(bits);
                if (arch)
                    sdpa__strlcpy(p.cpu_arch, arch, sizeof p.cpu_arch);
                p.amx_permitted = (bits & SDPA_CPU_AMX_BF16) != 0;
                snprintf(p.cpu_model, sizeof p.cpu_model, "described CPU");
                p.cpu_vendor[0] = '\0'; /* unless vendor= says */
                p.cpu_family = 0;
            } else {
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "platform '%s': '%s' unknown, expected isa=LEVEL, "
                                  "features=NAME+NAME..., vendor=intel|amd|other or family=N",
                                  spec, tok);
            }
        }
        if (vendor) {
            sdpa__strlcpy(p.cpu_vendor, vendor, sizeof p.cpu_vendor);
            p.cpu_family = 0; /* a described vendor: no particular core, unless family= says */
        }
        if (family > 0)
            p.cpu_family = (int)family;
    } else if (strcmp(buf, "cuda") == 0) {
        if (!rest)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "platform '%s': expected cuda:sm_XY[,cudnn=N], e.g. cuda:sm_100",
                              spec);
        int have_sm = 0;
        p.cudnn_version = 91900;
        char *save = NULL;
        for (char *tok = strtok_r(rest, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (parse_sm(tok, &p.cc_major, &p.cc_minor)) {
                have_sm = 1;
            } else if (strncmp(tok, "cudnn=", 6) == 0) {
                char *end;
                long v = strtol(tok + 6, &end, 10);
                if (*end || end == tok + 6 || v < 0 || v > 999999)
                    return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                      "platform '%s': cudnn version '%s' is not a number like "
                                      "91900 (9.19.0); 0 means no cuDNN",
                                      spec, tok + 6);
                p.cudnn_version = (int)v;
            } else {
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "platform '%s': '%s' unknown, expected sm_XY or cudnn=N", spec,
                                  tok);
            }
        }
        if (!have_sm)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "platform '%s': no compute capability, expected e.g. sm_90", spec);
        p.cuda_present = 1;
        p.cuda_why[0] = '\0';
        snprintf(p.gpu_name, sizeof p.gpu_name, "simulated sm_%d%d", p.cc_major, p.cc_minor);
    } else {
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "platform '%s': expected cpu[:isa=LEVEL|features=LIST|vendor=V|family=N] or "
                          "cuda:sm_XY[,cudnn=N]",
                          spec);
    }
    *out = p;
    return SDPA_OK;
}
