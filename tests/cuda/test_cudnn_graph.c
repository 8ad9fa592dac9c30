/*
 * test_cudnn_graph.c - our cuDNN SDPA graph, checked without a GPU.
 *
 * For every row of diffusion-gpu.tsv and smoke.tsv, on device
 * descriptions of an sm_90 and an sm_100 GPU (DEVICEPROP from JSON), the
 * graph must finalize and cuDNN's heuristics must offer at least one engine
 * configuration: a wiring mistake shows up as zero configurations (or a
 * BAD_PARAM), which on a real GPU would silently latch every layer to the
 * fallback. Negative controls (head dim 100, sm_75) must get none. For a
 * few rows an execution plan is built far enough for cuDNN to compile the
 * kernel; with the toolkit's stub driver it then fails to load it
 * (EXECUTION_FAILED_CUDA_DRIVER), which is the expected end without a GPU.
 *
 * usage: test_cudnn_graph SHAPES_DIR   (needs the stub libcuda.so.1 on the
 * library path; CTest sets it)
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda/cudnn_graph.h"
#include "support/testlib.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *device_json(int sm)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64],"
             "\"regsPerBlock\":65536,\"multiProcessorCount\":%d,\"warpSize\":32,"
             "\"maxSharedMemoryPerBlock\":49152,\"maxSharedMemoryPerBlockOptin\":%d,"
             "\"reservedSharedMemoryPerBlock\":1024,\"maxRegistersPerSM\":65536,"
             "\"maxCtasPerSM\":32,\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":%d,"
             "\"pciDeviceId\":0,\"isTccDriver\":0,\"supportCoopLaunch\":1,"
             "\"totalGlobalMem\":%lld,\"smClockRateKHz\":1980000,\"memClockRateKHz\":2619000,"
             "\"l2CacheSize\":%d,\"cudaDeviceId\":0,\"deviceVer\":%d,\"driverVer\":13000,"
             "\"deviceName\":\"simulated sm_%d\"}",
             sm >= 100 ? 148 : sm >= 90 ? 132 : 40, sm >= 90 ? 232448 : 65536,
             sm >= 90 ? 2048 : 1024, sm >= 90 ? 85899345920ll : 17179869184ll,
             sm >= 90 ? 52428800 : 4194304, sm * 10, sm);
    return buf;
}

typedef struct row {
    char name[64];
    long long B, Sq, Skv, Hq, Hkv, D, causal;
    int padded; /* the row has a seq_len_kv=N column: cuDNN's padding mask */
} row;

static int read_rows(const char *path, row *rows, int max)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[1024];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        row *r = &rows[n];
        memset(r, 0, sizeof *r);
        if (sscanf(line, "%63s %lld %lld %lld %lld %lld %lld %lld", r->name, &r->B, &r->Sq,
                   &r->Skv, &r->Hq, &r->Hkv, &r->D, &r->causal) == 8) {
            r->padded = strstr(line, "seq_len_kv=") != NULL;
            n++;
        }
    }
    fclose(f);
    return n;
}

static sdpa_cudnn_problem problem(const row *r)
{
    sdpa_cudnn_problem p;
    memset(&p, 0, sizeof p);
    p.b = r->B, p.hq = r->Hq, p.hk = r->Hkv, p.sq = r->Sq, p.skv = r->Skv, p.d = r->D;
    sdpa_cudnn_bshd_strides(p.sq, p.hq, p.d, p.q_stride);
    sdpa_cudnn_bshd_strides(p.skv, p.hk, p.d, p.k_stride);
    sdpa_cudnn_bshd_strides(p.skv, p.hk, p.d, p.v_stride);
    sdpa_cudnn_bshd_strides(p.sq, p.hq, p.d, p.o_stride);
    p.io_type = CUDNN_DATA_BFLOAT16;
    p.causal = (int)r->causal;
    p.padding = r->padded;
    return p;
}

/* Engine configurations offered for the row on sm (or -1 on an error). */
static int configs_for(const sdpa_cudnn_problem *p, int sm, cudnnBackendDescriptor_t *first)
{
    sdpa_cudnn_graph g;
    const char *where = "?";
    cudnnStatus_t st = sdpa_cudnn_graph_build(p, &g, &where);
    if (st != CUDNN_STATUS_SUCCESS) {
        printf("  graph: %s failed with %d (%s)\n", where, (int)st, cudnnGetErrorString(st));
        sdpa_cudnn_graph_free(&g);
        return -1;
    }
    cudnnBackendDescriptor_t dev;
    if ((st = sdpa_cudnn_devprop_json(device_json(sm), &dev)) != CUDNN_STATUS_SUCCESS) {
        printf("  devprop: %d (%s)\n", (int)st, cudnnGetErrorString(st));
        sdpa_cudnn_graph_free(&g);
        return -1;
    }
    int n = 0;
    cudnnBackendDescriptor_t cfg[4];
    st = sdpa_cudnn_engine_configs(&g, dev, first ? cfg : NULL, first ? 4 : 0, &n);
    if (st != CUDNN_STATUS_SUCCESS) {
        printf("  heuristics: %d (%s)\n", (int)st, cudnnGetErrorString(st));
        n = -1;
    }
    if (first && n > 0) {
        /* Build a plan from the first config: cuDNN compiles the kernel. */
        cudnnBackendDescriptor_t plan;
        int64_t ws;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        cudnnStatus_t ps = sdpa_cudnn_build_plan(cfg[0], dev, NULL, &plan, &ws); /* ahead of time */
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        printf("  plan finalize on sm_%d: status %d (%s) after %.2f s\n", sm, (int)ps,
               cudnnGetErrorString(ps), s);
        /* Success (a real driver) or the stub's load failure, after compiling. */
        CHECK(ps == CUDNN_STATUS_SUCCESS || ps == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER,
              "plan for %lld,%lld,%lld,%lld,%lld,%lld on sm_%d: %d (%s)", (long long)p->b,
              (long long)p->sq, (long long)p->skv, (long long)p->hq, (long long)p->hk,
              (long long)p->d, sm, (int)ps, cudnnGetErrorString(ps));
        if (ps == CUDNN_STATUS_SUCCESS)
            cudnnBackendDestroyDescriptor(plan);
        for (int i = 0; i < n; i++)
            cudnnBackendDestroyDescriptor(cfg[i]);
    }
    cudnnBackendDestroyDescriptor(dev);
    sdpa_cudnn_graph_free(&g);
    return n;
}

/* The status table of shared/notes/cudnn-backend-sdpa.md, section 6, code
 * by code, as the dispatcher must see it (latch, process-wide, pass through). */
static void status_mapping(void)
{
    static const struct {
        int code, executing;
        const char *detail;
        sdpa_status want;
    } rows[] = {
        {CUDNN_STATUS_NOT_INITIALIZED, 0, "", SDPA_NOT_AVAILABLE},
        {CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, 0, "", SDPA_NOT_AVAILABLE},
        {CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, 1, "", SDPA_NOT_AVAILABLE},
        {CUDNN_STATUS_LICENSE_ERROR, 0, "", SDPA_NOT_AVAILABLE},
        {CUDNN_STATUS_BAD_PARAM, 0, "", SDPA_INTERNAL},
        {CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, 1, "", SDPA_INTERNAL},
        {CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, 0, "", SDPA_INTERNAL},
        {CUDNN_STATUS_NOT_SUPPORTED, 0, "", SDPA_UNSUPPORTED},
        {CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, 0, "", SDPA_UNSUPPORTED},
        {CUDNN_STATUS_NOT_SUPPORTED_SHAPE, 1, "", SDPA_UNSUPPORTED},
        {CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, 0, "", SDPA_UNSUPPORTED},
        {CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE, 0, "", SDPA_UNSUPPORTED},
        {CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER, 0, "", SDPA_NOT_AVAILABLE},
        {CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH, 0, "", SDPA_NOT_AVAILABLE},
        {CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, 0, "", SDPA_NOT_AVAILABLE},
        {CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, 0, "", SDPA_NOT_AVAILABLE},
        {CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, 0, "", SDPA_OUT_OF_MEMORY},
        {CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, 1, "", SDPA_OUT_OF_MEMORY},
        {CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, 0, "", SDPA_UNSUPPORTED},
        {CUDNN_STATUS_INTERNAL_ERROR, 0, "", SDPA_UNSUPPORTED},
        {CUDNN_STATUS_INTERNAL_ERROR, 1, "", SDPA_DEVICE_ERROR},
        {CUDNN_STATUS_EXECUTION_FAILED, 1, "", SDPA_DEVICE_ERROR},
        {CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, 1, "", SDPA_DEVICE_ERROR},
        {CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, 0, "cuLibraryLoadData returned error (34)",
         SDPA_UNSUPPORTED},
        {CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, 0, "cuLibraryLoadData returned error (2)",
         SDPA_OUT_OF_MEMORY},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        sdpa_status got = sdpa_cudnn_status_map(rows[i].code, rows[i].executing, rows[i].detail);
        CHECK(got == rows[i].want, "cuDNN status %d (%s) mapped to %s, expected %s", rows[i].code,
              rows[i].executing ? "executing" : "building", sdpa_status_string(got),
              sdpa_status_string(rows[i].want));
    }
}

/*
 * The descriptor of a real device, through the code cuda.cudnn runs
 * (sdpa_cudnn_devprop_device): without a GPU the attribute is set and only
 * finalizing (which reads the device) may fail. A device id of the wrong
 * width is refused when it is set (status 2010 on cuDNN 9.19), which the
 * control below shows, so this is the check that a wrong type fails.
 */
static void device_descriptor(void)
{
    cudnnBackendDescriptor_t dev = NULL;
    const char *where = "";
    cudnnStatus_t st = sdpa_cudnn_devprop_device(0, &dev, &where);
    printf("device properties of device 0: status %d (%s)%s%s\n", (int)st,
           cudnnGetErrorString(st), st ? " at " : "", st ? where : "");
    CHECK(st == CUDNN_STATUS_SUCCESS || strcmp(where, "the device id") != 0,
          "cuDNN refused the device id attribute: %d (%s)", (int)st, cudnnGetErrorString(st));
    CHECK(st == CUDNN_STATUS_SUCCESS || dev == NULL, "a failed descriptor was left allocated");
    if (dev)
        cudnnBackendDestroyDescriptor(dev);
    /* the control: a 64-bit id is refused at the attribute */
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &dev) ==
        CUDNN_STATUS_SUCCESS) {
        int64_t id = 0;
        st = cudnnBackendSetAttribute(dev, CUDNN_ATTR_DEVICEPROP_DEVICE_ID, CUDNN_TYPE_INT64, 1,
                                      &id);
        CHECK(st != CUDNN_STATUS_SUCCESS, "cuDNN took a 64-bit device id (the check above "
                                          "would then not show a wrong type)");
        cudnnBackendDestroyDescriptor(dev);
    }
}

int main(int argc, char **argv)
{
    printf("cuDNN %zu (cudart %zu)\n", cudnnGetVersion(), cudnnGetCudartVersion());
    status_mapping();
    device_descriptor();
    if (argc < 2) {
        printf("usage: test_cudnn_graph SHAPES_DIR\n");
        return 2;
    }
    static const char *suites[] = {"diffusion-gpu.tsv", "smoke.tsv"};
    static const int sms[] = {90, 100};
    int planned = 0;
    for (int s = 0; s < 2; s++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", argv[1], suites[s]);
        row rows[64];
        int n = read_rows(path, rows, 64);
        if (n <= 0) {
            tl_skip(path, "suite not found");
            continue;
        }
        for (int i = 0; i < n; i++)
            for (int k = 0; k < 2; k++) {
                sdpa_cudnn_problem p = problem(&rows[i]);
                const int plan = s == 1 && planned < 2 && rows[i].Sq > 1;
                cudnnBackendDescriptor_t dummy;
                int c = configs_for(&p, sms[k], plan ? &dummy : NULL);
                planned += plan;
                printf("%-20s %-18s sm_%d: %d engine config(s)%s\n", rows[i].name, suites[s],
                       sms[k], c, p.padding ? " (padding mask)" : "");
                CHECK(c > 0, "%s (%s) on sm_%d: no engine configuration for our graph", rows[i].name,
                      suites[s], sms[k]);
            }
    }
    /* Negative controls: the check above must be able to fail. */
    row bad = {"d100", 1, 256, 256, 4, 4, 100, 0, 0};
    sdpa_cudnn_problem p = problem(&bad);
    CHECK(configs_for(&p, 90, NULL) == 0, "head dim 100 should have no engine");
    row old = {"sm75", 1, 256, 256, 4, 4, 64, 0, 0};
    p = problem(&old);
    CHECK(configs_for(&p, 75, NULL) == 0, "sm_75 should have no engine");
    /* Causal bottom-right and the LSE as a real output build too. */
    row cross = {"cross-causal", 1, 256, 512, 8, 2, 128, 2, 0};
    p = problem(&cross);
    p.want_stats = 1;
    CHECK(configs_for(&p, 100, NULL) > 0, "bottom-right causal GQA with stats on sm_100");
    /* The padding mask (sequence lengths) with each causal alignment, with
     * and without stats, on both devices; and one plan compiled. */
    for (int causal = 0; causal <= 2; causal++)
        for (int k = 0; k < 2; k++) {
            row pad = {"padded", 2, 300, 512, 8, 2, 64, causal, 1};
            p = problem(&pad);
            p.want_stats = k;
            cudnnBackendDescriptor_t dummy;
            const int c = configs_for(&p, sms[k], causal == 2 && k == 1 ? &dummy : NULL);
            printf("padding mask, causal %d, stats %d, sm_%d: %d engine config(s)\n", causal, k,
                   sms[k], c);
            CHECK(c > 0, "padding mask with causal %d (stats %d) on sm_%d: no engine", causal,
                  k, sms[k]);
        }
    return tl_finish();
}
