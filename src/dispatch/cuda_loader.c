/*
 * cuda_loader.c - finds and loads libsdpa_cuda.so (../cuda/plugin.h), and
 * records exactly why not when it cannot: no plugin built, failed dlopen,
 * wrong ABI, no driver, no device. Loaded once per process.
 */
#define _GNU_SOURCE
#include "cuda_loader.h"
#include "../cuda/plugin.h"
#include "environment.h"
#include "registry.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KERNELS 8

static pthread_once_t once = PTHREAD_ONCE_INIT;
static sdpa_backend merged[MAX_KERNELS]; /* declared backends with the plugin's run */
static int n_merged;

/* The declared backend's run, calling the plugin's kernel (in state) with
 * the plugin ABI's view of the call. */
static sdpa_cuda_call plugin_call(const sdpa_call *c)
{
    sdpa_cuda_call pc = {c->q,     c->k,      c->v,     c->out,           c->lse,
                         c->scale, c->causal, c->deterministic, c->stream, c->desc,
                         c->mask,  c->cuda_flash_variant};
    return pc;
}

static sdpa_status plugin_run(const sdpa_backend *self, const sdpa_call *c)
{
    const sdpa_cuda_kernel *k = self->state;
    const sdpa_cuda_call pc = plugin_call(c);
    return k->run(&pc);
}

static sdpa_status plugin_prepare(const sdpa_backend *self, const sdpa_call *c)
{
    const sdpa_cuda_kernel *k = self->state;
    const sdpa_cuda_call pc = plugin_call(c);
    return k->prepare(&pc);
}

/* A plugin kernel can run when the plugin's probe found a device. */
static int kernel_present(const sdpa_backend *self, const sdpa_platform *host, char *why,
                          size_t n)
{
    (void)self;
    if (host->cuda_present)
        return 1;
    sdpa__fmt(why, n, "not present here: %s", host->cuda_why);
    return 0;
}
static const sdpa_cuda_plugin *plugin;
static char plugin_path[1024];
static char load_error[160]; /* fits sdpa_platform.cuda_why */

/* The absolute directory of the library (or program) this code was linked
 * into. The loader may report a relative name ("./libsdpa.so.0", found
 * through LD_LIBRARY_PATH=.): it is resolved now, against the directory
 * the process started in, never looked up later in whatever "." is then. */
static int own_directory(char *dir, size_t n)
{
    Dl_info info;
    char real[PATH_MAX];
    if (!dladdr((void *)&sdpa__cuda_probe, &info) || !info.dli_fname ||
        !strchr(info.dli_fname, '/') || !realpath(info.dli_fname, real))
        return 0; /* a bare name: we do not know where, and will not guess "." */
    const char *slash = strrchr(real, '/');
    size_t len = (size_t)(slash - real);
    if (len + 1 > n)
        return 0;
    memcpy(dir, real, len);
    dir[len] = '\0';
    return 1;
}

static void load_once(void)
{
    /* Read once per process, when the first context (or platform probe)
     * loads the plugin. */
    char env[sizeof plugin_path];
    const size_t env_length = sdpa__env_read_one(SDPA_ENV_CUDA_PLUGIN, env, sizeof env);
    char dir[896];
    if (env_length >= sizeof plugin_path) {
        snprintf(load_error, sizeof load_error,
                 "SDPA_CUDA_PLUGIN is %zu characters long, expected at most %zu (refused)",
                 env_length, sizeof plugin_path - 1);
        return;
    }
    if (*env) {
        sdpa__strlcpy(plugin_path, env, sizeof plugin_path);
    } else if (own_directory(dir, sizeof dir)) {
        snprintf(plugin_path, sizeof plugin_path, "%s/libsdpa_cuda.so", dir);
    } else {
        sdpa__strlcpy(load_error, "no CUDA plugin: cannot tell where libsdpa is installed",
                      sizeof load_error);
        return;
    }
    if (plugin_path[0] != '/') {
        snprintf(load_error, sizeof load_error,
                 "SDPA_CUDA_PLUGIN='%.60s' is not an absolute path (refused)", plugin_path);
        return;
    }
    void *h = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        if (!*env && e && strstr(e, "No such file"))
            snprintf(load_error, sizeof load_error,
                     "no CUDA plugin at %.60s (built only with the CUDA toolkit; "
                     "SDPA_CUDA_PLUGIN names another)",
                     plugin_path);
        else
            snprintf(load_error, sizeof load_error, "CUDA plugin %.50s cannot be loaded: %.60s",
                     plugin_path, e ? e : "?");
        return;
    }
    sdpa_cuda_plugin_entry_fn entry;
    *(void **)&entry = dlsym(h, SDPA_CUDA_PLUGIN_ENTRY);
    const sdpa_cuda_plugin *p = entry ? entry() : NULL;
    if (!p || p->abi != SDPA_CUDA_PLUGIN_ABI) {
        snprintf(load_error, sizeof load_error,
                 "CUDA plugin %.60s: %s (expected ABI %d)", plugin_path,
                 !entry ? "no " SDPA_CUDA_PLUGIN_ENTRY " symbol" : "wrong ABI version",
                 SDPA_CUDA_PLUGIN_ABI);
        dlclose(h);
        return;
    }
    static const sdpa_cuda_host host = {sdpa__fail};
    p->init(&host);
    plugin = p; /* kept loaded for the life of the process */
    for (int i = 0; p->kernels && p->kernels[i].name && n_merged < MAX_KERNELS; i++)
        for (int b = 0; sdpa__builtin_backends[b]; b++)
            if (strcmp(sdpa__builtin_backends[b]->name, p->kernels[i].name) == 0) {
                sdpa_backend *m = &merged[n_merged++];
                *m = *sdpa__builtin_backends[b];
                m->version = p->kernels[i].version;
                m->present = kernel_present;
                m->state = (void *)&p->kernels[i];
                m->run = plugin_run;
                m->prepare = p->kernels[i].prepare ? plugin_prepare : NULL;
            }
}

int sdpa__cuda_backends(const sdpa_backend **out, int max)
{
    sdpa_platform scratch;
    memset(&scratch, 0, sizeof scratch);
    sdpa__cuda_probe(&scratch); /* loads once */
    int n = 0;
    for (; n < n_merged && n < max; n++)
        out[n] = &merged[n];
    return n;
}

void sdpa__cuda_probe(sdpa_platform *p)
{
    pthread_once(&once, load_once);
    p->cuda_present = 0;
    if (!plugin) {
        sdpa__strlcpy(p->cuda_why, load_error, sizeof p->cuda_why);
        return;
    }
    char why[160] = "";
    if (plugin->probe(p, why, sizeof why)) {
        p->cuda_present = 1;
        p->cuda_why[0] = '\0';
    } else {
        snprintf(p->cuda_why, sizeof p->cuda_why, "plugin %.40s loaded, no usable device: %.80s",
                 plugin_path, why);
    }
}

sdpa_status sdpa_platform_detect(sdpa_platform *out)
{
    return sdpa__platform_detect(out, sdpa__cuda_probe);
}
