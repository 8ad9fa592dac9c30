/*
 * bench.c - `sdpa bench`: times backends side by side on shape suites.
 *
 * Method: sdpa_warmup and one warm-up call per backend, then `reps`
 * rounds; each round runs every backend once, starting at a different backend each round, so slow
 * drift of the machine (frequency, a neighbour's load) hits all alike.
 * Reported per (row, backend): median, min and max milliseconds and
 * GFLOP/s from the median, with FLOPs = 4 B Hq Sq Skv D (halved for causal
 * with Sq == Skv). "chosen" is what the dispatcher would run for the row.
 * --backward times sdpa_backward instead (from the out and LSE of one
 * forward call, a random dout), counting its five products: 2.5 times the
 * forward's FLOPs.
 *
 * Rows with few query rows per KV head (at most FEW_ROWS: decode steps)
 * are bound by memory, not by the FMA rate: for them a streaming read of
 * the row's own K and V by as many threads (stream.h) takes a turn in
 * every round, and %bw is that read's median time over each backend's
 * (100% = K and V read once at the speed the machine reads them).
 *
 * --cold: before every timed turn (a backend's call, the streaming read)
 * the run reads COLD_BYTES of its own, on as many threads, so that the
 * row's K and V come from DRAM, as in a decode step that follows the other
 * layers' work; without it a row repeated finds its K and V in L2 or L3
 * when they fit there.
 */
#define _POSIX_C_SOURCE 200809L
#include "commands.h"
#ifdef SDPA_HAVE_MPI
#include "sp.h"
#endif
#include "output.h"
#include "stream.h"
#include "tool.h"
#include "suite.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BENCH_BACKENDS 16
#define FEW_ROWS 16 /* query rows per KV head up to which %bw is measured */
#define COLD_BYTES ((size_t)256 << 20) /* --cold: more than any L3 seen (32-105 MB) */

/* Bytes of a tensor's memory from its first element to its last. */
static size_t tensor_span(const sdpa_tensor *t)
{
    int64_t last = 0;
    for (int i = 0; i < 4; i++)
        last += (t->size[i] - 1) * t->stride[i];
    return (size_t)(last + 1) * sdpa_dtype_size(t->dtype);
}

/*
 * GFLOP/s per backend per row as grouped bars, with the measured ceiling
 * as a dashed line: a picture of the table, written as plain SVG.
 */
typedef struct plot {
    const row *rows;
    int n_rows;
    const char *const *names;
    int nb;
    const double *gf;
    double ceiling;
} plot;

static int write_plot(FILE *f, const void *user, char *err, size_t errn)
{
    const plot *pl = user;
    const row *rows = pl->rows;
    const int n_rows = pl->n_rows, nb = pl->nb;
    const char *const *names = pl->names;
    const double *gf = pl->gf, ceiling = pl->ceiling;
    (void)err, (void)errn; /* errno says why */
    static const char *colours[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                    "#59a14f", "#edc948", "#b07aa1", "#ff9da7"};
    double top = ceiling;
    for (int i = 0; i < n_rows * nb; i++)
        top = gf[i] > top ? gf[i] : top;
    top = top > 0 ? top * 1.1 : 1;
    const int left = 60, bottom = 120, group = 14 * nb + 16, height = 360;
    const int width = left + 20 + group * n_rows + 160;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' "
               "font-family='sans-serif' font-size='11'>\n<rect width='100%%' height='100%%' "
               "fill='white'/>\n", width, height + bottom + 30);
    fprintf(f, "<text x='%d' y='18' font-size='13'>sdpa bench: GFLOP/s per backend (median), "
               "dashed: fp32 FMA ceiling %.0f GFLOP/s measured in the run</text>\n", left, ceiling);
    for (int k = 0; k <= 4; k++) { /* axis and grid */
        const double v = top * k / 4;
        const double y = 30 + height - height * v / top;
        fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#ddd'/>"
                   "<text x='%d' y='%.1f' text-anchor='end'>%.0f</text>\n",
                left, width - 160, y, y, left - 4, y + 4, v);
    }
    for (int r = 0; r < n_rows; r++) {
        const int x0 = left + 10 + r * group;
        for (int b = 0; b < nb; b++) {
            const double h = height * gf[r * nb + b] / top;
            fprintf(f, "<rect x='%d' y='%.1f' width='12' height='%.1f' fill='%s'/>\n",
                    x0 + b * 14, 30 + height - h, h, colours[b % 8]);
        }
        fprintf(f, "<text transform='translate(%d,%d) rotate(60)'>%s</text>\n", x0 + 4,
                34 + height, rows[r].name);
    }
    if (ceiling > 0) {
        const double y = 30 + height - height * ceiling / top;
        fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='black' "
                   "stroke-dasharray='6,4'/>\n", left, width - 160, y, y);
    }
    for (int b = 0; b < nb; b++)
        fprintf(f, "<rect x='%d' y='%d' width='12' height='12' fill='%s'/>"
                   "<text x='%d' y='%d'>%s</text>\n",
                width - 150, 40 + 18 * b, colours[b % 8], width - 132, 50 + 18 * b, names[b]);
    fprintf(f, "</svg>\n");
    return ferror(f) || fflush(f) != 0 ? -1 : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* First present candidate the dispatcher would try, or "-". */
static const char *dispatcher_choice(sdpa_context *ctx, const sdpa_call_desc *d)
{
    static _Thread_local sdpa_decision dec;
    if (sdpa_decide(ctx, d, &dec) != SDPA_OK || dec.status != SDPA_OK)
        return "-";
    for (int c = 0; c < dec.n_candidates; c++)
        for (int i = 0; i < dec.n_backends; i++)
            if (dec.backends[i].candidate == c && dec.backends[i].present)
                return dec.backends[i].name;
    return "-";
}

int cmd_bench(int argc, char **argv)
{
    tool_flag f[] = {{"--suite", 1, NULL},   {"--shape", 1, NULL}, {"--backends", 1, NULL},
                     {"--dtype", 1, NULL},   {"--causal", 1, NULL}, {"--reps", 1, NULL},
                     {"--threads", 1, NULL}, {"--json", 0, NULL},   {"--plot", 1, NULL},
                     {"--sp", 1, NULL},      {"--backward", 0, NULL}, {"--cold", 0, NULL}};
    enum { SUITE, SHAPE, BACKENDS, DTYPE, CAUSAL, REPS, THREADS, JSON, PLOT, SP, BACKWARD, COLD, NF };
    int rc = tool_parse_flags(argc, argv, f, NF);
    if (rc)
        return rc;
    static row rows[MAX_ROWS];
    int n_rows, threads;
    sdpa_dtype dtype;
    if ((rc = suite_args(f[SUITE].value, f[SHAPE].value, f[DTYPE].value, f[THREADS].value, rows,
                         &n_rows, &dtype, &threads)) != 0)
        return rc;
    if (f[PLOT].value) { /* a bad --plot path fails now, not after the run */
        tool_output probe = {"--plot", f[PLOT].value, write_plot, NULL, "", 0, 0};
        char err[640];
        if (tool_outputs_resolve(&probe, 1, err, sizeof err) != 0)
            return tool_usage_error("%s", err);
    }
    sdpa_causal causal = SDPA_CAUSAL_NONE;
    if (f[CAUSAL].value && !tool_parse_causal(f[CAUSAL].value, &causal))
        return tool_usage_error("--causal '%s' unknown, expected none, top-left or bottom-right",
                                f[CAUSAL].value);
    long long reps = 5;
    if (f[REPS].value && !tool_parse_int(f[REPS].value, 1, 1000, &reps))
        return tool_usage_error("--reps '%s' is not a number in 1..1000", f[REPS].value);
    const int backward = f[BACKWARD].value != NULL;
    for (int r = 0; r < n_rows; r++) {
        if (f[CAUSAL].value)
            rows[r].d.causal = causal;
        if (backward) /* the backward pass reads the forward's LSE */
            rows[r].d.backward = rows[r].d.want_lse = 1;
    }
    if (f[SP].value && backward)
        return tool_usage_error("--sp times the forward pass only (no --backward)");
    if (f[SP].value && f[COLD].value)
        return tool_usage_error("--cold times calls on one process (no --sp)");
    if (f[SP].value) { /* sequence-parallel over the ranks mpirun started */
#ifdef SDPA_HAVE_MPI
        if (f[BACKENDS].value || f[JSON].value || f[PLOT].value)
            return tool_usage_error("--sp takes --suite/--shape, --dtype, --causal, --reps and "
                                    "--threads only");
        sp_session sp;
        if ((rc = sp_begin(f[SP].value, &sp)) != 0)
            return rc;
        sdpa_context *sctx;
        if ((rc = sp_agree(&sp, tool_context(NULL, threads, &sctx))) == 0) {
            static sdpa_call_desc descs[MAX_ROWS];
            const char *rnames[MAX_ROWS];
            int n = 0;
            for (int r = 0; r < n_rows; r++)
                if (!rows[r].d.mask)
                    descs[n] = rows[r].d, rnames[n++] = rows[r].name;
                else if (sp.rank == 0)
                    printf("# not run with --sp: %s (a padding mask; --sp takes none yet)\n",
                           rows[r].name);
            rc = sp_bench(&sp, sctx, rnames, descs, n, dtype, (int)reps);
            sdpa_context_destroy(sctx);
        }
        sp_end(&sp);
        return rc;
#else
        return tool_usage_error("--sp: this sdpa was built without MPI (libsdpa_mpi)");
#endif
    }

    sdpa_context *ctx;
    if ((rc = tool_context(NULL, threads, &ctx)) != 0)
        return rc;
    const char *names[MAX_BENCH_BACKENDS];
    int nb = 0;
    if ((rc = suite_backends(ctx, f[BACKENDS].value, 1, names, MAX_BENCH_BACKENDS, &nb)) != 0) {
        sdpa_context_destroy(ctx);
        return rc;
    }
    const int json = f[JSON].value != NULL;
    const sdpa_platform *plat = sdpa_context_platform(ctx);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    /* The ceiling every figure is a fraction of, measured in this run. */
    double ceiling = 0;
    const char *ceiling_isa = "none";
    if (sdpa_measure_ceiling(ctx, "fp32", &ceiling, &ceiling_isa) != SDPA_OK)
        ceiling = 0;
    /* Backends whose products are bf16 are measured against the ceiling of
     * their unit: AMX tiles (cpu.amx) or VDPBF16PS (cpu.avx512bf16); the
     * others against the fp32 FMA one. */
    double amx_ceiling = 0, dpbf16_ceiling = 0;
    if (sdpa_measure_ceiling(ctx, "amx-bf16", &amx_ceiling, NULL) != SDPA_OK)
        amx_ceiling = 0;
    if (sdpa_measure_ceiling(ctx, "avx512bf16", &dpbf16_ceiling, NULL) != SDPA_OK)
        dpbf16_ceiling = 0;
    double bceil[MAX_BENCH_BACKENDS];
    for (int b = 0; b < nb; b++) {
        bceil[b] = ceiling;
        for (int i = 0; i < sdpa_backend_count(ctx); i++) {
            sdpa_backend_info bi;
            if (sdpa_backend_get(ctx, i, &bi) == SDPA_OK && strcmp(bi.name, names[b]) == 0 &&
                bi.product_bits == 8)
                bceil[b] = (bi.cpu_features & SDPA_CPU_AMX_BF16) ? amx_ceiling : dpbf16_ceiling;
        }
    }
    /* In-run baselines for the ratio columns, when benchmarked. */
    int base_portable = -1, base_blas = -1;
    for (int b = 0; b < nb; b++) {
        if (strcmp(names[b], "cpu.portable") == 0)
            base_portable = b;
        if (strcmp(names[b], "cpu.blas") == 0)
            base_blas = b;
    }
    if (!json) {
        printf("# sdpa bench %s  %s  %d threads  dtype %s  %lld reps (interleaved), %s\n",
               sdpa_version(), plat->cpu_model, sdpa_context_threads(ctx), sdpa_dtype_name(dtype),
               reps, date);
        if (backward)
            printf("# backward pass (sdpa_backward, --backward): GFLOP/s count its five "
                   "products, 2.5x the forward's FLOPs\n");
        printf("# ceiling: fp32 FMA peak %.0f GFLOP/s (%s probe, %d threads, this run); "
               "x portable / x blas: speed-up over those backends in this run\n",
               ceiling, ceiling_isa, sdpa_context_threads(ctx));
        if (dpbf16_ceiling > 0)
            printf("# ceiling: AVX512-BF16 peak %.0f GFLOP/s (VDPBF16PS probe, this run); "
                   "cpu.avx512bf16's %%peak is of this one\n",
                   dpbf16_ceiling);
        if (amx_ceiling > 0)
            printf("# ceiling: AMX bf16 peak %.0f GFLOP/s (TDPBF16PS probe, this run); "
                   "cpu.amx's %%peak is of this one\n",
                   amx_ceiling);
        if (!backward)
            printf("# bandwidth: on rows with at most %d query rows per KV head, %%bw = the "
                   "median time of a streaming read of the row's K and V (%d threads, a turn in "
                   "every round) over the backend's\n",
                   FEW_ROWS, sdpa_context_threads(ctx));
        if (f[COLD].value)
            printf("# cold: before every timed call and streaming read, %zu MB of other memory "
                   "are read on %d threads (K and V from DRAM, as in a decode step after other "
                   "layers)\n",
                   COLD_BYTES >> 20, sdpa_context_threads(ctx));
        printf("%-20s %2s %6s %6s %3s %3s %4s %-6s  %-14s %10s %10s %10s %9s %6s %10s %7s %5s  %s\n",
               "row", "B", "Sq", "Skv", "Hq", "Hkv", "D", "causal", "backend", "median_ms",
               "min_ms", "max_ms", "GFLOP/s", "%peak", "x portable", "x blas", "%bw", "");
    }

    double *t = malloc(sizeof(double) * (size_t)reps * (2 * MAX_BENCH_BACKENDS + 1));
    double *tdense = t ? t + (size_t)reps * (MAX_BENCH_BACKENDS + 1) : NULL; /* sparse rows */
    if (!t) {
        sdpa_context_destroy(ctx);
        return tool_usage_error("out of memory");
    }
    stream_reader *reader = NULL; /* made at the first few-query row, or now for --cold */
    const int cold = f[COLD].value != NULL;
    char *cold_mem = NULL;
    if (cold) {
        cold_mem = malloc(COLD_BYTES);
        if (cold_mem)
            memset(cold_mem, 1, COLD_BYTES); /* its pages exist before any timing */
        if (!cold_mem || !(reader = stream_reader_make(sdpa_context_threads(ctx)))) {
            free(cold_mem), free(t);
            sdpa_context_destroy(ctx);
            return tool_usage_error("--cold: out of memory for its %zu MB to read",
                                    COLD_BYTES >> 20);
        }
    }
    const void *cold_bufs[1] = {cold_mem};
    const size_t cold_bytes[1] = {COLD_BYTES};
    static double plot_gf[MAX_ROWS * MAX_BENCH_BACKENDS];
    rc = 0;
    int failed = 0;
    for (int r = 0; r < n_rows && rc == 0; r++) {
        sdpa_call_desc *d = &rows[r].d;
        problem pb;
        problem_grads pg;
        if (!problem_make(&pb, d, rows[r].seq_len_kv, dtype, dtype, backward)) {
            rc = tool_usage_error("row %s: out of memory for its tensors", rows[r].name);
            break;
        }
        char sp_err[256];
        if (problem_sparse(&pb, &rows[r], sp_err, sizeof sp_err) != 0) {
            rc = tool_usage_error("row %s: %s", rows[r].name, sp_err);
            problem_free(&pb);
            break;
        }
        if (backward && !problem_backward_make(&pg, &pb, ctx, d)) {
            rc = tool_usage_error("row %s: its forward call for the backward pass: %s",
                                  rows[r].name, sdpa_last_error());
            problem_free(&pb);
            break;
        }
        /* A sparse row: every backend also runs the dense call (the same
         * masks but the pattern) in its own turns, for the speed-up over
         * it; GFLOP/s count the keys the pattern visits. */
        const int sparse = rows[r].sparse[0] != 0;
        const double visited = sparse ? pb.sparse.density : 1.0;
        sdpa_mask dense_store = pb.mask_store;
        dense_store.window = NULL, dense_store.blocks = NULL;
        const sdpa_mask *dense_mask = pb.lens ? &dense_store : NULL;
        sdpa_tensor tq = pb.q, tk = pb.k, tv = pb.v, to = pb.out;
        const char *chosen = dispatcher_choice(ctx, d);
        char padded[48] = ""; /* a padded row says so; GFLOP/s count its real keys */
        if (pb.lens)
            snprintf(padded, sizeof padded, "seq_len_kv=%lld", (long long)rows[r].seq_len_kv);
        char refused[MAX_BENCH_BACKENDS][256];
        sdpa_status status[MAX_BENCH_BACKENDS];
        int claimed[MAX_BENCH_BACKENDS];
        for (int b = 0; b < nb; b++) {
            sdpa_params p = SDPA_PARAMS_DEFAULT;
            p.backend = names[b];
            p.causal = d->causal;
            p.mask = pb.mask;
            refused[b][0] = '\0';
            /* A backend that does not take the call (dtype, head dim) is
             * left out of the row and named once at the end. */
            if (!(claimed[b] = suite_claims(ctx, d, dtype, names[b], refused[b], sizeof refused[b]))) {
                suite_note_unclaimed(names[b], refused[b]);
                status[b] = SDPA_UNSUPPORTED;
                continue;
            }
            /* Warm-up: what the backend builds on first use (cuDNN plans), then one call. */
            sdpa_status st = backward ? SDPA_OK : sdpa_warmup(ctx, &tq, &tk, &tv, &to, NULL, &p);
            if (st == SDPA_OK)
                st = backward ? sdpa_backward(ctx, &tq, &tk, &tv, &to, pb.lse, &pg.dout, NULL,
                                              &pg.dq, &pg.dk, &pg.dv, &p)
                              : sdpa_forward(ctx, &tq, &tk, &tv, &to, NULL, &p);
            status[b] = st;
            if (st != SDPA_OK)
                snprintf(refused[b], sizeof refused[b], "%s: %s", sdpa_status_string(st),
                         sdpa_last_error());
        }
        /* few query rows: the streaming read of K and V takes turn nb */
        const int few = !backward && d->Hq / d->Hkv * d->Sq <= FEW_ROWS &&
                        (reader || (reader = stream_reader_make(sdpa_context_threads(ctx))));
        const void *kv_mem[2] = {tk.data, tv.data};
        const size_t kv_bytes[2] = {tensor_span(&tk), tensor_span(&tv)};
        double *tbw = t + (size_t)reps * MAX_BENCH_BACKENDS, bw_med = 0;
        const int turns = nb + few + (sparse ? nb : 0);
        for (long long rep = 0; rep < reps; rep++)
            for (int j = 0; j < turns; j++) {
                int b = (int)((j + rep) % turns);
                if (cold)
                    stream_read_ms(reader, cold_bufs, cold_bytes, 1);
                if (few && b == nb) {
                    tbw[rep] = stream_read_ms(reader, kv_mem, kv_bytes, 2);
                    continue;
                }
                const int dense_turn = b >= nb + few;
                if (dense_turn)
                    b -= nb + few;
                if (refused[b][0])
                    continue;
                sdpa_params p = SDPA_PARAMS_DEFAULT;
                p.backend = names[b];
                p.causal = d->causal;
                p.mask = dense_turn ? dense_mask : pb.mask;
                if (dense_turn) {
                    const double t0 = tool_now_ms();
                    const sdpa_status st =
                        backward ? sdpa_backward(ctx, &tq, &tk, &tv, &to, pb.lse, &pg.dout, NULL,
                                                 &pg.dq, &pg.dk, &pg.dv, &p)
                                 : sdpa_forward(ctx, &tq, &tk, &tv, &to, NULL, &p);
                    tdense[b * reps + rep] = st == SDPA_OK ? tool_now_ms() - t0 : -1.0;
                    continue;
                }
                double t0 = tool_now_ms();
                sdpa_status st = backward ? sdpa_backward(ctx, &tq, &tk, &tv, &to, pb.lse,
                                                          &pg.dout, NULL, &pg.dq, &pg.dk,
                                                          &pg.dv, &p)
                                          : sdpa_forward(ctx, &tq, &tk, &tv, &to, NULL, &p);
                t[b * reps + rep] = tool_now_ms() - t0;
                if (st != SDPA_OK) { /* a timed call failed: no figure for it */
                    status[b] = st;
                    snprintf(refused[b], sizeof refused[b], "%s in a timed call: %s",
                             sdpa_status_string(st), sdpa_last_error());
                }
            }
        if (few) {
            qsort(tbw, (size_t)reps, sizeof(double), cmp_double);
            bw_med = reps % 2 ? tbw[reps / 2] : 0.5 * (tbw[reps / 2 - 1] + tbw[reps / 2]);
        }
        double med[MAX_BENCH_BACKENDS], med_dense[MAX_BENCH_BACKENDS] = {0};
        int winner = -1;
        for (int b = 0; b < nb; b++) {
            if (refused[b][0])
                continue;
            if (sparse) { /* a failed dense call (-1) sorts first: no figure then */
                qsort(&tdense[b * reps], (size_t)reps, sizeof(double), cmp_double);
                med_dense[b] = tdense[b * reps] < 0 ? 0.0
                               : reps % 2 ? tdense[b * reps + reps / 2]
                                          : 0.5 * (tdense[b * reps + reps / 2 - 1] +
                                                   tdense[b * reps + reps / 2]);
            }
            qsort(&t[b * reps], (size_t)reps, sizeof(double), cmp_double);
            med[b] = reps % 2 ? t[b * reps + reps / 2]
                              : 0.5 * (t[b * reps + reps / 2 - 1] + t[b * reps + reps / 2]);
            if (winner < 0 || med[b] < med[winner])
                winner = b;
        }
        for (int b = 0; b < nb; b++) {
            if (!claimed[b])
                continue;
            failed |= status[b] != SDPA_OK;
            const double mn = t[b * reps], mx = t[b * reps + reps - 1];
            const double gf = refused[b][0] ? 0.0
                                            : (backward ? 2.5 : 1.0) * visited *
                                                  suite_flops(d, rows[r].seq_len_kv) /
                                                  (med[b] * 1e6);
            const double vs_dense =
                sparse && !refused[b][0] && med_dense[b] > 0 ? med_dense[b] / med[b] : 0.0;
            const double pct = bceil[b] > 0 ? 100.0 * gf / bceil[b] : 0.0;
            plot_gf[r * nb + b] = gf;
            const double vs_portable = base_portable >= 0 && !refused[base_portable][0] &&
                                               !refused[b][0]
                                           ? med[base_portable] / med[b]
                                           : 0.0;
            const double vs_blas =
                base_blas >= 0 && !refused[base_blas][0] && !refused[b][0] ? med[base_blas] / med[b]
                                                                           : 0.0;
            if (json) {
                printf("{\"row\":\"%s\",\"B\":%lld,\"Sq\":%lld,\"Skv\":%lld,\"Hq\":%lld,"
                       "\"Hkv\":%lld,\"D\":%lld,\"dtype\":\"%s\",\"causal\":%s,\"backend\":\"%s\"",
                       rows[r].name, (long long)d->B, (long long)d->Sq, (long long)d->Skv,
                       (long long)d->Hq, (long long)d->Hkv, (long long)d->D,
                       sdpa_dtype_name(dtype), d->causal ? "true" : "false", names[b]);
                if (backward)
                    printf(",\"backward\":true");
                if (rows[r].seq_len_kv > 0 || d->mask)
                    printf(",\"seq_len_kv\":%lld", (long long)rows[r].seq_len_kv);
                if (refused[b][0]) {
                    printf(",\"median_ms\":null,\"min_ms\":null,\"max_ms\":null,\"gflops\":null,"
                           "\"error\":\"%s\",\"message\":",
                           sdpa_status_string(status[b]));
                    suite_json_string(refused[b]);
                }
                else
                    printf(",\"median_ms\":%.4f,\"min_ms\":%.4f,\"max_ms\":%.4f,\"gflops\":%.2f,"
                           "\"pct_peak\":%.2f,\"ceiling_gflops\":%.1f",
                           med[b], mn, mx, gf, pct, bceil[b]);
                if (vs_portable > 0)
                    printf(",\"speedup_vs_portable\":%.3f", vs_portable);
                if (vs_blas > 0)
                    printf(",\"speedup_vs_blas\":%.3f", vs_blas);
                if (sparse) {
                    printf(",\"sparse\":");
                    suite_json_string(rows[r].sparse);
                    printf(",\"density\":%.4f", visited);
                    if (vs_dense > 0)
                        printf(",\"dense_ms\":%.4f,\"speedup_vs_dense\":%.3f", med_dense[b],
                               vs_dense);
                }
                if (few && !refused[b][0])
                    printf(",\"pct_bandwidth\":%.2f,\"stream_gbps\":%.2f",
                           100.0 * bw_med / med[b],
                           (double)(kv_bytes[0] + kv_bytes[1]) / (bw_med * 1e6));
                if (cold)
                    printf(",\"cold\":true");
                printf(",\"reps\":%lld,\"threads\":%d,\"winner\":%s,\"chosen\":\"%s\"}\n", reps,
                       sdpa_context_threads(ctx), b == winner ? "true" : "false", chosen);
            } else if (refused[b][0]) {
                printf("%-20s %2lld %6lld %6lld %3lld %3lld %4lld %-6s  %-14s refused: %s\n",
                       rows[r].name, (long long)d->B, (long long)d->Sq, (long long)d->Skv,
                       (long long)d->Hq, (long long)d->Hkv, (long long)d->D,
                       d->causal ? "yes" : "no", names[b], refused[b]);
                /* printed as "refused: STATUS: message" */
            } else {
                char rp[16] = "-", rb[16] = "-", rw[16] = "-";
                if (vs_portable > 0)
                    snprintf(rp, sizeof rp, "%.2f", vs_portable);
                if (vs_blas > 0)
                    snprintf(rb, sizeof rb, "%.2f", vs_blas);
                if (few)
                    snprintf(rw, sizeof rw, "%.0f%%", 100.0 * bw_med / med[b]);
                printf("%-20s %2lld %6lld %6lld %3lld %3lld %4lld %-6s  %-14s %10.3f %10.3f "
                       "%10.3f %9.2f %5.1f%% %10s %7s %5s  %s%s%s\n",
                       rows[r].name, (long long)d->B, (long long)d->Sq, (long long)d->Skv,
                       (long long)d->Hq, (long long)d->Hkv, (long long)d->D,
                       d->causal ? "yes" : "no", names[b], med[b], mn, mx, gf, pct, rp, rb, rw,
                       b == winner ? "winner " : "",
                       strcmp(names[b], chosen) == 0 ? "chosen " : "", padded);
                if (sparse) /* the speed-up over the backend's own dense call, and its ideal */
                    printf("%-20s   sparse=%s density %.3f: dense %.3f ms, x dense %.2f "
                           "(ideal 1/density %.2f, target 0.8/density %.2f)\n",
                           "", rows[r].sparse, visited, med_dense[b], vs_dense, 1.0 / visited,
                           0.8 / visited);
            }
        }
        if (!json && few)
            printf("#   %s: K and V %.1f MB, streamed in %.3f ms (median) = %.1f GB/s\n",
                   rows[r].name, (double)(kv_bytes[0] + kv_bytes[1]) / 1e6, bw_med,
                   (double)(kv_bytes[0] + kv_bytes[1]) / (bw_med * 1e6));
        if (!json && strcmp(chosen, "-") != 0) {
            int listed = 0;
            for (int b = 0; b < nb; b++)
                listed |= strcmp(names[b], chosen) == 0;
            if (!listed)
                printf("%-20s dispatcher would choose %s (not benchmarked)\n", "", chosen);
        }
        fflush(stdout);
        if (backward)
            problem_backward_free(&pg);
        problem_free(&pb);
    }
    free(t);
    free(cold_mem);
    stream_reader_free(reader);
    suite_print_unclaimed(json);
    if (rc == 0 && failed)
        rc = 1; /* a backend that takes the call failed it: say so in the exit code */
    if (rc == 0 && f[PLOT].value) {
        plot pl = {rows, n_rows, names, nb, plot_gf, ceiling};
        tool_output o1 = {"--plot", f[PLOT].value, write_plot, &pl, "", 0, 0};
        char err[640];
        if (tool_outputs_resolve(&o1, 1, err, sizeof err) != 0 ||
            tool_outputs_write(&o1, 1, err, sizeof err) != 0)
            rc = tool_usage_error("%s", err);
    }
    sdpa_context_destroy(ctx);
    return rc;
}
