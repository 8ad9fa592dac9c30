/* cpu_backend.c - the presence check CPU descriptors share (cpu_backend.h). */
#include "cpu_backend.h"
#include "../core/cpu_features.h"

int sdpa__cpu_backend_present(const sdpa_backend *self, const sdpa_platform *host, char *why,
                              size_t n)
{
    if (self->not_built) {
        sdpa__fmt(why, n, "not built: %s", self->not_built);
        return 0;
    }
    const unsigned missing = self->caps.cpu_features & ~host->cpu_features;
    /* The table lists features from the most common up; the last missing
     * one is the specific reason (no AVX512-BF16, rather than no AVX-512). */
    for (size_t i = sdpa__cpu_feature_count; i-- > 0;) {
        const sdpa_cpu_feature *f = &sdpa__cpu_feature_table[i];
        if (!(missing & f->bit))
            continue;
        if (!(host->cpu_features_present & f->bit))
            sdpa__fmt(why, n, "not usable here: this CPU has no %s", f->title);
        else if (f->bit == SDPA_CPU_AMX_BF16)
            sdpa__fmt(why, n, "not usable here: AMX present but the OS refused the tile "
                              "permission (or SDPA_MAX_ISA caps it)");
        else
            sdpa__fmt(why, n, "not usable here: %s disabled (OS support or SDPA_MAX_ISA)",
                      f->title);
        return 0;
    }
    return 1;
}

sdpa_status sdpa__cpu_backend_not_built(const sdpa_backend *self, const sdpa_call *call)
{
    (void)call;
    return sdpa__fail(SDPA_NOT_AVAILABLE, "%s: not built: %s", self->name,
                      self->not_built ? self->not_built : "no kernel in this build");
}
