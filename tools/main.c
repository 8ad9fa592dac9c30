/*
 * main.c - the command-line tool's entry point: the command table and the
 * usage of every command. Each command lives in its own file (commands.h).
 *
 * Errors are one line on stderr and a non-zero exit: 2 for bad usage, 1
 * when the library refused or failed. A failing command leaves every file
 * that existed as it was.
 */
#include "commands.h"
#include "sdpa.h"

#include <stdio.h>
#include <string.h>

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    const char *usage; /* the flags, one per line */
} command;

static const command commands[] = {
    {"run", cmd_run, "attention on .npy files (float32 or float16, [B, S, H, D])",
     "  --q Q.npy --k K.npy --v V.npy   inputs; k and v one dtype, q may differ (mixed)\n"
     "  --out O.npy                     output, float32 [B, Sq, Hq, D]\n"
     "  --lse L.npy                     log-sum-exp, float32 [B, Hq, Sq]\n"
     "  --backend NAME                  run this backend or fail (sdpa info lists them)\n"
     "  --causal none|top-left|bottom-right\n"
     "  --scale X                       finite, non-zero; default 1/sqrt(D)\n"
     "  --dtype f32|f16|bf16            convert every input to this dtype first\n"
     "  --kv-dtype f32|f16|bf16         k and v to this dtype instead (q f32, k/v f16:\n"
     "                                  a mixed call, as stable-diffusion.cpp makes)\n"
     "  --threads N                     CPU threads (default: all)\n"
     "  --seq-len-q L,..  --seq-len-kv L,..   real lengths per batch entry (padding)\n"
     "  --key-mask K.npy                float32 [B or 1, Skv], nonzero = attend\n"
     "  --mask M.npy                    float32 [B or 1, H or 1, Sq, Skv], added to the\n"
     "                                  scores (-inf hides a key)\n"
     "  --sp ring|ulysses|usp:UxR       under mpirun: sequence-parallel over the ranks\n"
     "                                  (every rank reads the inputs, rank 0 writes)\n"
     "  --sparse SPEC                   window=L,R | nbhd=T,H,W:wt,wh,ww[:P[,S]] |\n"
     "                                  sta=T,H,W:tt,th,tw:wt,wh,ww[:P[,S]] | radial=T,H,W[:P] |\n"
     "                                  random=S: a window or block map on the call\n"
     "Outputs are written all or nothing; a symbolic link is written through, a\n"
     "character device or FIFO in place.\n"},
    {"explain", cmd_explain, "the dispatcher's decision for a call, and why",
     "  --shape B,Sq,Skv,Hq,Hkv,D       required\n"
     "  --dtype f32|f16|bf16            default f32 (bf16 on cuda platforms)\n"
     "  --kv-dtype f32|f16|bf16         k and v's dtype when not q's (a mixed call)\n"
     "  --causal none|top-left|bottom-right\n"
     "  --lse                           the call wants the log-sum-exp\n"
     "  --platform cpu|cpu:isa=LEVEL|cuda:sm_XY[,cudnn=N]   decide for that machine\n"
     "  --quant NAME  --component NAME  --backend NAME  --deterministic\n"
     "  --mask none|seq_len|key|general|window|blocks[,..]   the masks the call carries\n"
     "  --sparse SPEC                   a pattern as `run --sparse`: its kind, and its density\n"
     "  --backward                      the backward pass (sdpa_backward; it reads the LSE)\n"
     "  --json                          one JSON object\n"},
    {"bench", cmd_bench, "interleaved timing of backends on shape suites",
     "  --suite FILE | --shape B,Sq,Skv,Hq,Hkv,D\n"
     "  --backends a,b,...|all          default: the dispatcher's choice and peers\n"
     "  --dtype f32|f16|bf16  --causal ..  --reps N  --threads N\n"
     "  --json                          one JSON object per row\n"
     "  --plot FILE.svg                 GFLOP/s per row and backend\n"
     "  --backward                      time the backward pass (sdpa_backward)\n"
     "  --cold                          K and V from DRAM: 256 MB of other memory read\n"
     "                                  before every timed call (a decode step's view)\n"
     "  --sp ring|ulysses|usp:UxR       under mpirun: each row sequence-parallel; per rank\n"
     "                                  time, compute, blocked time, bytes and overlap\n"},
    {"check", cmd_check, "numerics of every backend against the float64 reference",
     "  --suite FILE | --shape ..  --backends a,b|all  --dtype ..  --threads N\n"
     "  --budget GFLOP                  skip rows above this much work\n"
     "  --json\n"},
    {"ab", cmd_ab, "interleaved A/B of two backends or rule files, with a 95% interval",
     "  --a SPEC --b SPEC               SPEC: backend=NAME or rules=FILE\n"
     "  --suite FILE | --shape .. | --dit image|video [--steps K]\n"
     "  --rounds N  --dtype ..  --threads N  --json\n"},
    {"tune", cmd_tune, "policy rules from measurements, with evidence",
     "  --suite FILE | --shape ..  --out RULES\n"
     "  --install [--system]   instead of --out: as this user's (or the system's)\n"
     "                         wisdom, which every context loads (default suite\n"
     "                         diffusion-cpu); see `sdpa info` for the lookup\n"
     "  --backends a,b  --reps N  --dtype ..  --threads N  --min-gain F\n"},
    {"dit", cmd_dit, "a small diffusion transformer end to end; two arms: PSNR/SSIM",
     "  --config image|video  --steps K  --seed N  --threads N  --verbose\n"
     "  --backends A[,B] | --rules FA[,FB]   one arm, or two to compare\n"
     "  --attn-dtype f32|f16|bf16       dtype of the attention inputs\n"
     "  --out PREFIX                    write PREFIX-a.png (and -b.png)\n"
     "  --sp ring|ulysses|usp:UxR       under mpirun: arm b runs the attention sharded;\n"
     "                                  PSNR and max pixel difference against arm a\n"},
    {"info", cmd_info, "the platform, the kernel choice and every backend",
     "  --platform ..                   describe that machine instead\n"
     "  --json                          one JSON object (what libsdpa.info() returns)\n"},
};
enum { N_COMMANDS = sizeof commands / sizeof *commands };

static const command *find(const char *name)
{
    for (int i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

static void command_usage(FILE *f, const command *c)
{
    fprintf(f, "usage: sdpa %s [flags]   %s\n%s", c->name, c->summary, c->usage);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: sdpa COMMAND [flags]\n");
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "  help CMD  the flags of CMD (also: sdpa CMD --help)\n"
               "  --version\n"
               "environment (read when a context is created, never per call):\n");
    const char *values, *meaning, *name;
    for (int i = 0; (name = sdpa_env_variable(i, &values, &meaning)) != NULL; i++)
        fprintf(f, "  %-24s %s: %s\n", name, values, meaning);
    /* the tool's own, not the library's */
    fprintf(f, "  %-24s %s: %s\n", "SDPA_SHAPES_DIR", "a directory",
            "where --suite NAME looks first for NAME.tsv");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        if (argc > 2) {
            const command *c = find(argv[2]);
            if (!c) {
                fprintf(stderr, "sdpa: error: help: unknown command '%s'\n", argv[2]);
                return 2;
            }
            command_usage(stdout, c);
            return 0;
        }
        usage(stdout);
        return 0;
    }
    if (strcmp(name, "--version") == 0) {
        printf("sdpa %s\n", sdpa_version());
        return 0;
    }
    const command *c = find(name);
    if (!c) {
        usage(stderr);
        fprintf(stderr, "sdpa: error: unknown command '%s'\n", name);
        return 2;
    }
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            command_usage(stdout, c);
            return 0;
        }
    return c->run(argc - 2, argv + 2);
}
