/*
 * test_platform.c - CPU detection from described CPUs, and the AMX
 * permission refusal falling back cleanly.
 *
 * Detection reads CPUID, XCR0 and the kernel's answer to the AMX request
 * through sdpa__set_cpu_probe, so a Sapphire-Rapids-like CPU can be
 * described on any machine: with the tile permission granted, refused, or
 * with the OS not enabling the tile state at all. The refusal is then
 * carried through a whole context: the log line, `info`'s reason, the
 * decision and a bf16 forward call that the next kernel (cpu.avx512bf16)
 * serves correctly. That last part runs real AVX-512 BF16 kernels, so it
 * needs them here; it is skipped, saying so, where the machine lacks them. A described CPU with the
 * permission granted never gets a context: cpu.amx's self-test would run
 * tile instructions this machine may not have. And the default worker
 * count: one per CPU the process may run on (held to one CPU here, a
 * context's pool has one worker, not one per online CPU time-slicing),
 * and the CPU quotas of described cgroups (v1 and v2 trees in a temporary
 * folder) read as that many CPUs.
 */
#define _GNU_SOURCE /* sched_getaffinity */
#include "support/testlib.h"
#include "core/core.h"
#include "core/cpu_features.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) /* CPUID and XCR0 are x86-64 matters */
/* ---- a described CPU */

static unsigned fake_leaf1_ecx, fake_leaf7_ebx, fake_leaf7_edx, fake_leaf71_eax;
static uint64_t fake_xcr0;
static int fake_grant, amx_requests;

static int fake_cpuid(unsigned leaf, unsigned sub, unsigned r[4])
{
    memset(r, 0, 4 * sizeof *r);
    if (leaf == 0x80000000u) {
        r[0] = 0x80000004u;
        return 1;
    }
    if (leaf >= 0x80000002u && leaf <= 0x80000004u) {
        static const char brand[48] = "Described Xeon with AMX";
        memcpy(r, brand + 16 * (leaf - 0x80000002u), 16);
        return 1;
    }
    if (leaf == 1) {
        r[2] = fake_leaf1_ecx;
        return 1;
    }
    if (leaf == 7 && sub == 0) {
        r[0] = 1, r[1] = fake_leaf7_ebx, r[3] = fake_leaf7_edx;
        return 1;
    }
    if (leaf == 7 && sub == 1) {
        r[0] = fake_leaf71_eax;
        return 1;
    }
    return 0;
}

static uint64_t fake_xgetbv0(void) { return fake_xcr0; }

static int fake_request_amx(void)
{
    amx_requests++;
    return fake_grant;
}

static const sdpa_cpu_probe fake = {fake_cpuid, fake_xgetbv0, fake_request_amx};

/* Sapphire Rapids' bits: FMA, OSXSAVE, AVX, F16C; AVX2, AVX512 F/DQ/BW/VL;
 * AMX-BF16, AVX512-FP16, AMX-TILE; AVX512-BF16; XCR0 with x87, SSE, AVX,
 * the three AVX-512 states and both tile states. */
static void describe_sapphire_rapids(int grant)
{
    fake_leaf1_ecx = (1u << 12) | (1u << 27) | (1u << 28) | (1u << 29);
    fake_leaf7_ebx = (1u << 5) | (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    fake_leaf7_edx = (1u << 22) | (1u << 23) | (1u << 24);
    fake_leaf71_eax = 1u << 5;
    fake_xcr0 = 0xe7 | (3ull << 17);
    fake_grant = grant;
    amx_requests = 0;
}

static void detection(void)
{
    const unsigned all = SDPA_CPU_AVX2 | SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16 |
                         SDPA_CPU_AVX512FP16 | SDPA_CPU_AMX_BF16;
    sdpa_platform p;
    sdpa__set_cpu_probe(&fake);

    describe_sapphire_rapids(1); /* permission granted */
    CHECK_STATUS(sdpa_platform_detect(&p), SDPA_OK);
    CHECK(p.cpu_features_present == all && p.cpu_features == all && p.amx_permitted == 1,
          "granted: present 0x%x usable 0x%x permitted %d", p.cpu_features_present,
          p.cpu_features, p.amx_permitted);
    CHECK(amx_requests == 1, "granted: %d permission requests, expected 1", amx_requests);
    CHECK(strcmp(p.cpu_model, "Described Xeon with AMX") == 0, "model '%s'", p.cpu_model);

    describe_sapphire_rapids(0); /* permission refused */
    CHECK_STATUS(sdpa_platform_detect(&p), SDPA_OK);
    CHECK(p.cpu_features_present == all && p.cpu_features == (all & ~(unsigned)SDPA_CPU_AMX_BF16) &&
              p.amx_permitted == 0,
          "refused: present 0x%x usable 0x%x permitted %d", p.cpu_features_present,
          p.cpu_features, p.amx_permitted);

    describe_sapphire_rapids(1); /* the OS does not enable the tile state: never asked */
    fake_xcr0 = 0xe7;
    CHECK_STATUS(sdpa_platform_detect(&p), SDPA_OK);
    CHECK(!(p.cpu_features & SDPA_CPU_AMX_BF16) && amx_requests == 0,
          "no tile state in XCR0: usable 0x%x after %d requests", p.cpu_features, amx_requests);

    describe_sapphire_rapids(1); /* no AVX-512 state in XCR0: AVX2 only */
    fake_xcr0 = 0x7;
    CHECK_STATUS(sdpa_platform_detect(&p), SDPA_OK);
    CHECK(p.cpu_features == SDPA_CPU_AVX2, "XCR0 without AVX-512 state: usable 0x%x",
          p.cpu_features);

    describe_sapphire_rapids(1); /* no OSXSAVE: nothing beyond SSE, XGETBV never run */
    fake_leaf1_ecx &= ~(1u << 27);
    CHECK_STATUS(sdpa_platform_detect(&p), SDPA_OK);
    CHECK(p.cpu_features == 0 && amx_requests == 0, "no OSXSAVE: usable 0x%x", p.cpu_features);

    sdpa__set_cpu_probe(NULL);
}

/* ---- the refusal through a context */

static char info_lines[4096];

static void capture(sdpa_log_level level, const char *msg, void *user)
{
    (void)level, (void)user;
    size_t len = strlen(info_lines);
    snprintf(info_lines + len, sizeof info_lines - len, "%s\n", msg);
}

static void refusal_falls_back(void)
{
    sdpa_platform real;
    sdpa_platform_detect(&real);
    const unsigned runs_here = SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16;
    if ((real.cpu_features & runs_here) != runs_here) {
        tl_skip("AMX refusal through a context",
                "this machine lacks AVX-512 or AVX512-BF16, which the described CPU has and its "
                "fallback kernels (cpu.avx512bf16, cpu.avx512) would run");
        return;
    }
    describe_sapphire_rapids(0);
    sdpa__set_cpu_probe(&fake);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 2, o.ignore_env = 1, o.log = capture, o.log_level = SDPA_LOG_INFO;
    sdpa_context *ctx = NULL;
    sdpa_status st = sdpa_context_create(&o, &ctx);
    sdpa__set_cpu_probe(NULL);
    CHECK_STATUS(st, SDPA_OK);
    if (st != SDPA_OK)
        return;

    CHECK(strstr(info_lines, "CPU kernel: AMX present but permission refused; f32 -> cpu.avx512, "
                             "f16 -> cpu.avx512, bf16 -> cpu.avx512bf16") != NULL,
          "no one-line ISA decision naming the refusal in:\n%s", info_lines);
    int found = 0;
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        sdpa_backend_get(ctx, i, &b);
        if (strcmp(b.name, "cpu.amx") == 0) {
            found = 1;
            CHECK(!b.present && strstr(b.why_absent, "refused"),
                  "cpu.amx present %d, why '%s'", b.present, b.why_absent);
        }
    }
    CHECK(found, "cpu.amx is not in the backend table");

    /* bf16, the dtype the rules send to cpu.amx first */
    tl_case c = {1, 77, 131, 4, 2, 128, SDPA_BF16, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0};
    sdpa_call_desc d;
    memset(&d, 0, sizeof d);
    d.device = SDPA_DEVICE_CPU, d.dtype = SDPA_BF16;
    d.B = c.B, d.Sq = c.Sq, d.Skv = c.Skv, d.Hq = c.Hq, d.Hkv = c.Hkv, d.D = c.D;
    d.want_lse = 1;
    sdpa_decision dec;
    CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_OK);
    int first = 0; /* the first candidate that can run here */
    while (first < dec.n_candidates && strcmp(dec.candidates[first], "cpu.amx") == 0)
        first++;
    CHECK(first < dec.n_candidates && strcmp(dec.candidates[first], "cpu.avx512bf16") == 0,
          "bf16 decided %s, expected cpu.avx512bf16",
          first < dec.n_candidates ? dec.candidates[first] : "none");
    char *text = NULL;
    CHECK_STATUS(sdpa_explain(ctx, &d, 0, &text), SDPA_OK);
    CHECK(text && strstr(text, "cpu.amx") && strstr(text, "refused"),
          "explain does not say why cpu.amx was passed over:\n%s", text ? text : "");
    sdpa_free(text);

    double diff;
    char ran[64];
    CHECK_STATUS(tl_run_against_ref(ctx, NULL, &c, &diff, ran, sizeof ran), SDPA_OK);
    CHECK(strcmp(ran, "cpu.avx512bf16") == 0, "ran %s", ran);
    CHECK(diff <= tl_tolerance(SDPA_BF16, SDPA_F32) + tl_product_tolerance(8),
          "fallback result off by %g (infinite: guard bytes touched)", diff);
    sdpa_context_destroy(ctx);
}

#endif

#if defined(__aarch64__)
/* On AArch64: NEON is the baseline, nothing to probe. */
static void aarch64_detection(void)
{
    sdpa_platform p;
    CHECK_STATUS(sdpa_platform_detect(&p), SDPA_OK);
    CHECK(p.cpu_features == SDPA_CPU_NEON && p.cpu_features_present == SDPA_CPU_NEON,
          "aarch64: features 0x%x, present 0x%x, expected NEON only", p.cpu_features,
          p.cpu_features_present);
    CHECK(strcmp(p.cpu_arch, "aarch64") == 0, "arch '%s'", p.cpu_arch);
}
#endif

/* A context created while the process may run on one CPU of several
 * gets one worker; threads = 3 is still taken as asked. */
static void default_threads_follow_affinity(void)
{
#if defined(__linux__)
    cpu_set_t was, one;
    if (sched_getaffinity(0, sizeof was, &was) != 0 || CPU_COUNT(&was) < 2) {
        tl_skip("the default worker count under an affinity mask",
                "this process may run on one CPU only (or its mask cannot be read)");
        return;
    }
    int first = 0;
    while (!CPU_ISSET(first, &was))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "cannot hold the test to CPU %d", first);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.ignore_env = 1;
    sdpa_context *ctx = NULL;
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_OK);
    CHECK(sdpa_context_threads(ctx) == 1, "held to one CPU: %d default workers, expected 1",
          sdpa_context_threads(ctx));
    char *text = NULL;
    CHECK_STATUS(sdpa_info(ctx, 0, &text), SDPA_OK);
    CHECK(text && strstr(text, "this process may run on 1"), "info does not say so:\n%s",
          text ? text : "(none)");
    sdpa_free(text);
    sdpa_context_destroy(ctx);
    o.threads = 3;
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_OK);
    CHECK(sdpa_context_threads(ctx) == 3, "threads = 3 asked: %d", sdpa_context_threads(ctx));
    sdpa_context_destroy(ctx);
    CHECK(sched_setaffinity(0, sizeof was, &was) == 0, "cannot give the CPUs back");
#else
    tl_skip("the default worker count under an affinity mask", "Linux only");
#endif
}

/* path (under the folder top) gets text, its folders made first */
static void put_file(const char *top, const char *path, const char *text)
{
    char full[1024];
    snprintf(full, sizeof full, "%s/%s", top, path);
    for (char *p = full + strlen(top) + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        mkdir(full, 0700);
        *p = '/';
    }
    FILE *f = fopen(full, "w");
    CHECK(f != NULL, "cannot write %s", full);
    if (f)
        fputs(text, f), fclose(f);
}

static int cgroup_cpus_in(const char *top, const char *membership)
{
    char root[512], self[512];
    snprintf(root, sizeof root, "%s/fs", top);
    snprintf(self, sizeof self, "%s/self-cgroup", top);
    put_file(top, "self-cgroup", membership);
    return sdpa__cgroup_cpus(root, self);
}

/* Quotas of described cgroups: v2's cpu.max, v1's cfs files, the smallest
 * along the path up, rounded up to whole CPUs; none set, none readable or
 * malformed: 0 (no limit). */
static void cgroup_quotas(void)
{
    char top[] = "/tmp/sdpa-cgroup-XXXXXX";
    if (!mkdtemp(top)) {
        CHECK(0, "cannot make a temporary folder");
        return;
    }
    CHECK(cgroup_cpus_in(top, "0::/\n") == 0, "no cpu.max: expected no limit");
    put_file(top, "fs/cpu.max", "max 100000\n");
    CHECK(cgroup_cpus_in(top, "0::/\n") == 0, "cpu.max 'max': %d, expected no limit",
          cgroup_cpus_in(top, "0::/\n"));
    put_file(top, "fs/kube/pod/cpu.max", "max 100000\n");
    put_file(top, "fs/kube/cpu.max", "250000 100000\n");
    CHECK(cgroup_cpus_in(top, "0::/kube/pod\n") == 3,
          "a parent's quota of 2.5 CPUs: %d, expected 3", cgroup_cpus_in(top, "0::/kube/pod\n"));
    put_file(top, "fs/kube/pod/cpu.max", "100000 100000\n");
    CHECK(cgroup_cpus_in(top, "0::/kube/pod\n") == 1, "the group's own 1 CPU below its "
          "parent's 2.5: %d", cgroup_cpus_in(top, "0::/kube/pod\n"));
    put_file(top, "fs/cpu,cpuacct/docker/c1/cpu.cfs_quota_us", "150000\n");
    put_file(top, "fs/cpu,cpuacct/docker/c1/cpu.cfs_period_us", "100000\n");
    const char *v1 = "12:pids:/docker/c1\n4:cpu,cpuacct:/docker/c1\n1:name=systemd:/x\n";
    CHECK(cgroup_cpus_in(top, v1) == 2, "v1 quota of 1.5 CPUs: %d, expected 2",
          cgroup_cpus_in(top, v1));
    put_file(top, "fs/cpu,cpuacct/docker/c1/cpu.cfs_quota_us", "-1\n");
    CHECK(cgroup_cpus_in(top, v1) == 0, "v1 quota -1: %d, expected no limit",
          cgroup_cpus_in(top, v1));
    put_file(top, "fs/cpu.max", "garbage\n");
    CHECK(cgroup_cpus_in(top, "0::/\n") == 0, "malformed cpu.max: expected no limit");
    CHECK(sdpa__cgroup_cpus(top, "/nonexistent/self-cgroup") == 0, "no membership file");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    CHECK(system(cmd) == 0, "cannot remove %s", top);
}

int main(void)
{
    tl_seed_from_env();
#if defined(__x86_64__)
    detection();
    refusal_falls_back();
#else
    tl_skip("CPUID detection and the AMX refusal", "x86-64 only; this build is for another "
                                                   "architecture");
#if defined(__aarch64__)
    aarch64_detection();
#endif
#endif
    /* every build: a described CPU takes the architecture of its features */
    sdpa_platform d;
    CHECK_STATUS(sdpa_platform_parse("cpu:features=neon", &d), SDPA_OK);
    CHECK(strcmp(d.cpu_arch, "aarch64") == 0 && d.cpu_features == SDPA_CPU_NEON,
          "cpu:features=neon: arch '%s', features 0x%x", d.cpu_arch, d.cpu_features);
    CHECK_STATUS(sdpa_platform_parse("cpu:features=avx2+avx512", &d), SDPA_OK);
    CHECK(strcmp(d.cpu_arch, "x86_64") == 0, "cpu:features=avx2+avx512: arch '%s'", d.cpu_arch);
    default_threads_follow_affinity();
    cgroup_quotas();
    return tl_finish();
}
