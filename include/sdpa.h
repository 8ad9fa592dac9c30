/*
 * sdpa.h - libsdpa, scaled-dot-product attention on the fastest correct
 * kernel for the machine and the shape, with the choice explained.
 *
 * This header is the whole public interface and its specification.
 *
 *   sdpa_context *ctx;
 *   if (sdpa_context_create(NULL, &ctx) != SDPA_OK) { puts(sdpa_last_error()); ... }
 *
 *   //                       data  dtype      B  S     H   D
 *   sdpa_tensor q = sdpa_tensor_bshd(qp, SDPA_BF16, 1, 4096, 24, 128);
 *   sdpa_tensor k = sdpa_tensor_bshd(kp, SDPA_BF16, 1, 4096, 24, 128);
 *   sdpa_tensor v = sdpa_tensor_bshd(vp, SDPA_BF16, 1, 4096, 24, 128);
 *   sdpa_tensor o = sdpa_tensor_bshd(op, SDPA_F32,  1, 4096, 24, 128);
 *   sdpa_params p = SDPA_PARAMS_DEFAULT;
 *   sdpa_status st = sdpa_forward(ctx, &q, &k, &v, &o, NULL, &p);
 *
 *   // A model builds one layer handle per attention module, once:
 *   sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
 *   ld.name = "blocks.3.attn1"; ld.component = "transformer";
 *   sdpa_layer *layer;
 *   sdpa_layer_create(ctx, &ld, &layer);
 *   st = sdpa_layer_forward(layer, &q, &k, &v, &o, NULL, &p);
 *   sdpa_layer_destroy(layer);
 *   sdpa_context_destroy(ctx);
 *
 * Conventions
 * - Every function that can fail returns sdpa_status. On failure
 *   sdpa_last_error() (per thread) names the argument, what was expected and,
 *   for backend failures, which backend said what. User input never aborts
 *   the process.
 * - Destroying NULL is a harmless no-op.
 * - Strings passed in are copied when kept; strings returned are owned by the
 *   library unless a function says to release them with sdpa_free().
 * - Contexts and layers are thread-safe: any number of threads may call
 *   sdpa_forward / sdpa_layer_forward on one context or one layer at once.
 *
 * Growing by addition (0.2.0 on)
 * - The structs callers fill (sdpa_params, sdpa_mask, sdpa_context_options,
 *   sdpa_layer_desc, sdpa_call_desc, sdpa_tune_options) start with
 *   `size_t size`: the sizeof the caller compiled against. Start from the
 *   struct's _DEFAULT macro, which sets it, then set fields by name. A
 *   release adds fields only at the end, and a field's zero means "as
 *   before it existed", so a program built against an older header runs
 *   unchanged: the library reads its struct as far as its size says.
 *   size 0 (a struct cleared with memset or a designated initialiser
 *   without .size) reads as the 0.2.0 layout; a size beyond the library's
 *   own (a program built against a newer libsdpa) is INVALID_ARGUMENT.
 * - The structs libsdpa fills (sdpa_platform, sdpa_decision,
 *   sdpa_backend_info, sdpa_tensor by value) grow only when the SONAME
 *   moves (README: Compatibility).
 */
#ifndef SDPA_H
#define SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; everything declared here
 * is exported. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define SDPA_VERSION_MAJOR 0
#define SDPA_VERSION_MINOR 2
#define SDPA_VERSION_PATCH 0
#define SDPA_VERSION_STRING "0.2.0"

const char *sdpa_version(void);

/* ---------------------------------------------------------------- status */

typedef enum sdpa_status {
    SDPA_OK = 0,
    SDPA_INVALID_ARGUMENT = 1, /* the caller's input is wrong; nothing written  */
    SDPA_UNSUPPORTED = 2,      /* this backend cannot run this exact call       */
    SDPA_OUT_OF_MEMORY = 3,    /* host or device allocation failed              */
    SDPA_DEVICE_ERROR = 4,     /* the device failed while running               */
    SDPA_NOT_AVAILABLE = 5,    /* backend not built or not usable on this machine */
    SDPA_INTERNAL = 6          /* a libsdpa bug: please report it               */
} sdpa_status;

/* A static, one-word description of a status ("invalid argument", ...). */
const char *sdpa_status_string(sdpa_status status);

/* The specifics of the last failure on the calling thread, or "" if the last
 * call succeeded. Valid until the next libsdpa call on this thread. */
const char *sdpa_last_error(void);

/* Releases memory returned by libsdpa (explanations, JSON text). */
void sdpa_free(void *p);

/* ---------------------------------------------------------------- tensors */

typedef enum sdpa_dtype {
    SDPA_F32 = 0,
    SDPA_F16 = 1, /* IEEE binary16 */
    SDPA_BF16 = 2 /* bfloat16 */
} sdpa_dtype;
#define SDPA_DTYPE_COUNT 3

const char *sdpa_dtype_name(sdpa_dtype dtype); /* "f32", "f16", "bf16" */
size_t sdpa_dtype_size(sdpa_dtype dtype);      /* bytes; 0 if unknown   */

typedef enum sdpa_device_kind {
    SDPA_DEVICE_CPU = 0,
    SDPA_DEVICE_CUDA = 1
} sdpa_device_kind;

typedef struct sdpa_device {
    sdpa_device_kind kind;
    int ordinal; /* CUDA device number; 0 for the CPU */
} sdpa_device;

/*
 * A four-dimensional view [B, S, H, D] of memory: batch, sequence position,
 * head, head-dimension element. stride[i] is the distance in ELEMENTS between
 * neighbours along dimension i (not bytes). Element (b, s, h, d) lives at
 *
 *     data + (b*stride[0] + s*stride[1] + h*stride[2] + d*stride[3]) * elemsize
 *
 * so the common layouts are only strides:
 *
 *     BSHD contiguous  stride = { S*H*D, H*D, D, 1 }
 *     BHSD contiguous  stride = { H*S*D, D,   S*D, 1 }
 *     q in packed QKV [B, S, 3, H, D]: data = base, stride = { S*3*H*D, 3*H*D, D, 1 }
 *                      k: data = base + H*D, v: data = base + 2*H*D, same strides.
 *
 * Sizes must be >= 1. Input strides must be >= 0 (0 broadcasts); output
 * strides must be >= 1 and must not make two output elements share memory.
 */
typedef struct sdpa_tensor {
    void *data;
    sdpa_dtype dtype;
    sdpa_device device;
    int64_t size[4];   /* B, S, H, D                 */
    int64_t stride[4]; /* in elements, per dimension */
} sdpa_tensor;

/* Contiguous [B, S, H, D] on the CPU. */
sdpa_tensor sdpa_tensor_bshd(void *data, sdpa_dtype dtype, int64_t B, int64_t S,
                             int64_t H, int64_t D);
/* Logical [B, S, H, D] stored as contiguous [B, H, S, D] on the CPU. */
sdpa_tensor sdpa_tensor_bhsd(void *data, sdpa_dtype dtype, int64_t B, int64_t S,
                             int64_t H, int64_t D);
/*
 * A view described innermost first with byte strides, as ggml describes
 * its tensors (ne[], nb[]): ne[i] elements along the i-th innermost axis,
 * nb[i] bytes between neighbours along it (a multiple of the element
 * size), and `order` naming those axes innermost first, one letter each of
 * d, s, h, b: ggml's q, k and v for ggml_flash_attn_ext are "dshb" (ne =
 * {D, S, H, B}), its permuted result "dhsb", and a [B, S, H*D] activation
 * viewed per head "dhsb" too. Fills *out (a CPU tensor), or
 * INVALID_ARGUMENT naming the argument; sdpa_forward checks the rest.
 * include/sdpa_ggml.h uses it for ggml tensors.
 */
sdpa_status sdpa_tensor_from_bytes(void *data, sdpa_dtype dtype, const int64_t ne[4],
                                   const size_t nb[4], const char *order, sdpa_tensor *out);

/*
 * Converts n elements between dtypes (round to nearest even on the way
 * down; NaN stays NaN, values beyond f16's range become infinities). dst
 * may be src itself when dst's elements are no wider than src's.
 */
sdpa_status sdpa_convert(const void *src, sdpa_dtype src_dtype, void *dst, sdpa_dtype dst_dtype,
                         size_t n);

/* ---------------------------------------------------------------- a call */

/*
 * Causal masking. Query i may attend key j when j <= i + offset, where
 *   TOP_LEFT:      offset = 0          (PyTorch is_causal=True)
 *   BOTTOM_RIGHT:  offset = Skv - Sq   (FlashAttention; the last query sees all keys)
 * The two agree when Sq == Skv. A query row that may attend no key at all
 * (bottom-right with Sq > Skv) produces an output row of zeros and LSE = -inf.
 */
typedef enum sdpa_causal {
    SDPA_CAUSAL_NONE = 0,
    SDPA_CAUSAL_TOP_LEFT = 1,
    SDPA_CAUSAL_BOTTOM_RIGHT = 2
} sdpa_causal;

const char *sdpa_causal_name(sdpa_causal c); /* "none", "top-left", "bottom-right" */

/*
 * Masks beyond causal: padding (sequence lengths), a key mask and a general
 * mask, each optional. Start from SDPA_MASK_DEFAULT. Query i may attend key
 * j when causal allows it AND every mask given allows it:
 *
 *   seq_len_q, seq_len_kv  int32 [B], or NULL: batch entry b has
 *       seq_len_q[b] real queries and seq_len_kv[b] real keys (values in
 *       0..Sq and 0..Skv). Query rows i >= seq_len_q[b] are padding: their
 *       output is 0 and their LSE -inf. Keys j >= seq_len_kv[b] are never
 *       attended. (cuDNN's padding mask; FlashAttention's varlen offsets
 *       carry the same information.) With sequence lengths, causal aligns
 *       on the real lengths: bottom-right's offset is
 *       seq_len_kv[b] - seq_len_q[b] (a missing array counts as full).
 *   key        bytes [B, Skv], or NULL: key j of batch entry b may be
 *       attended when key[b*key_stride[0] + j*key_stride[1]] != 0. A
 *       stride of 0 broadcasts (the same row for every b).
 *   general    [B, Hq, Sq, Skv] through general_stride (in elements; 0
 *       broadcasts, as torch's attn_mask of shape [B|1, H|1, Sq, Skv]), or
 *       NULL. SDPA_MASK_BOOL: bytes, nonzero = attend. SDPA_MASK_ADDITIVE:
 *       added to the scaled score before the softmax, in general_dtype
 *       (f32, or the inputs' dtype); -inf hides a key, and the non-finite
 *       rules of sdpa_forward apply to the sums.
 *   A key hidden by a mask contributes nothing, whatever its k holds; as
 *   with causal, NaN or Inf in its v row is unspecified for the rows it is
 *   hidden from (ref never reads it; a tiled kernel may multiply it by a
 *   zero weight).
 *
 * A query row that sees no key at all gives zeros and LSE -inf, never NaN.
 * The arrays live with the tensors (host memory for CPU tensors, device
 * memory for CUDA ones) and are read during the call only. Backends say
 * which kinds they take (sdpa_backend_info.masks); a backend that does not
 * take a call's mask is passed over with that reason, never run without it.
 */
typedef enum sdpa_mask_type { SDPA_MASK_BOOL = 0, SDPA_MASK_ADDITIVE = 1 } sdpa_mask_type;

/*
 * A 1-D sliding window with FlashAttention's semantics (window_size =
 * (left, right)): query i may attend key j when
 *     i + off - left <= j <= i + off + right,   off = Skv - Sq,
 * aligned bottom-right like causal (on the real lengths under seq_len
 * masks); -1 leaves that side unbounded. Computed, never stored. With
 * causal as well, both must allow a key.
 */
typedef struct sdpa_window {
    int64_t left, right; /* keys before and after the diagonal; -1: unbounded */
} sdpa_window;

/*
 * A block-sparse map in the layout of PyTorch FlexAttention's BlockMask
 * and FlashAttention-4: queries in blocks of block_q rows, keys in blocks
 * of block_kv (64 or 128 each; the last block of either may be short).
 * For each (batch entry, query head, query block), a count and an
 * ascending list of FULL key blocks (every key inside visible) and of
 * PARTIAL key blocks (visible where partial_bits says, or wholly when
 * partial_bits is NULL and the call's causal or window decides inside);
 * an unlisted key block is hidden. Arrays, int32, row (b, h, qb) at
 *     counts[(b * heads + h) * q_blocks + qb]
 *     indices[((b * heads + h) * q_blocks + qb) * index_stride + n]
 * with batch = 1 or B and heads = 1 or Hq (1 broadcasts: torch's [1, 1,
 * ...]), index_stride >= the largest count (torch's kv_indices have
 * kv_blocks). partial_bits, when given, holds block_q * block_kv / 64
 * words per partial entry at the entry's position (row * index_stride +
 * n): bit r * block_kv + c (word (r * block_kv + c) / 64, least
 * significant first) set when row r of the block may see key c of it;
 * how a FlexAttention mask_mod arrives. A key block may not be in both
 * lists. The call's other masks and causal still apply on top (AND).
 * Rows that see no key give zeros and LSE -inf. sdpa_block_map_3d()
 * builds one for a 3-D neighbourhood.
 */
typedef struct sdpa_block_map {
    int32_t block_q, block_kv;
    int64_t batch, heads;           /* 1 (broadcast), or B and Hq          */
    int64_t q_blocks, kv_blocks;    /* ceil(Sq / block_q), ceil(Skv / block_kv) */
    int64_t index_stride;           /* entries per row in full_index and partial_index */
    const int32_t *full_count;      /* [batch][heads][q_blocks], or NULL: no full blocks */
    const int32_t *full_index;      /* [batch][heads][q_blocks][index_stride]       */
    const int32_t *partial_count;   /* or NULL: no partial blocks              */
    const int32_t *partial_index;
    const uint64_t *partial_bits;   /* or NULL (see above)                      */
} sdpa_block_map;

typedef struct sdpa_mask {
    size_t size; /* sizeof(sdpa_mask) as the caller compiled it: the _DEFAULT macro
                  * sets it; 0 reads as the 0.2.0 layout (sdpa.h: growth) */
    const int32_t *seq_len_q;
    const int32_t *seq_len_kv;
    const uint8_t *key;
    int64_t key_stride[2];     /* b, j */
    const void *general;
    sdpa_mask_type general_type;
    sdpa_dtype general_dtype;  /* SDPA_MASK_ADDITIVE only */
    int64_t general_stride[4]; /* b, h, i, j */
    const sdpa_window *window;    /* or NULL: no window (added in 0.2) */
    const sdpa_block_map *blocks; /* or NULL: dense (added in 0.2)     */
#ifdef SDPA_ABI_GROWTH_TEST /* scripts/abi-check.sh: a field added after 0.2.0 */
    int64_t abi_growth_test; /* 8-aligned: it starts after 0.2.0's sizeof, padding and all */
#endif
} sdpa_mask;

#define SDPA_MASK_DEFAULT                                                                   \
    {sizeof(sdpa_mask), NULL, NULL, NULL, {0, 0}, NULL, SDPA_MASK_BOOL, SDPA_F32, {0, 0, 0, 0}, \
     NULL, NULL}

/* Mask kinds, as calls, rules and backends name them (bit mask). */
enum {
    SDPA_MASK_KIND_SEQ_LEN = 1u << 0, /* seq_len_q or seq_len_kv */
    SDPA_MASK_KIND_KEY = 1u << 1,
    SDPA_MASK_KIND_GENERAL = 1u << 2,
    SDPA_MASK_KIND_WINDOW = 1u << 3, /* sdpa_mask.window */
    SDPA_MASK_KIND_BLOCKS = 1u << 4  /* sdpa_mask.blocks */
};

/*
 * A 3-D neighbourhood over a latent video grid, built into a block map
 * (what Sliding Tile Attention and NATTEN compute). Tokens: `prefix` dense
 * tokens first (joint attention's text: they see every key and every row
 * sees them), then the T x H x W grid, row-major (t, y, x), or tile-major
 * when tile[] is set (tiles of tile[0] x tile[1] x tile[2] tokens in
 * row-major tile order, row-major inside a tile: STA's order; the grid
 * must then be a whole number of tiles).
 *
 * Query (t, y, x) sees key (t', y', x') when, on every axis a, the key's
 * coordinate lies in the query's window of window[a] positions (tokens, or
 * tiles when tile[] is set), started at p - window[a] / 2 and clamped to
 * the grid (NATTEN's border rule: every query sees exactly window[a]
 * positions on an axis of at least that many); window[a] <= 0 or beyond
 * the axis: the whole axis. causal_time: the time window instead ends at
 * the query's own frame (t - window[0] + 1 .. t; world models).
 * Per-head windows: heads > 1 with windows [heads][3] (heads = Hq of the
 * calls it is meant for); heads = 1 broadcasts.
 *
 * The map's blocks are block x block (64 or 128); key blocks whose every
 * entry is visible are FULL, those partly visible PARTIAL with their bits.
 * Memory: the listed blocks (and 2 KiB of bits per partial 128-block),
 * never Sq x Skv. Free it with sdpa_block_map_free.
 */
typedef struct sdpa_neighborhood_3d {
    int64_t grid[3];          /* T, H, W in tokens                              */
    int64_t tile[3];          /* tile-major order with windows in tiles, or 0s  */
    const int64_t *windows;   /* [heads][3]: window per axis (T, H, W)           */
    int64_t heads;            /* rows of windows: 1, or the calls' Hq            */
    int64_t prefix;           /* dense tokens before the grid (text)            */
    int causal_time;          /* 1: keys only from the query's frame and before  */
} sdpa_neighborhood_3d;

sdpa_status sdpa_block_map_3d(const sdpa_neighborhood_3d *nb, int32_t block,
                              sdpa_block_map **out);
/* The same with `suffix` dense tokens after the grid as well (joint
 * attention that puts the text last, as HunyuanVideo and Wan's joint
 * layouts do; they see every key and every row sees them): tokens are
 * prefix + T H W + suffix. An argument rather than a member: the struct
 * above has no size to grow by (added in 0.3). */
sdpa_status sdpa_block_map_3d_joint(const sdpa_neighborhood_3d *nb, int64_t suffix, int32_t block,
                                    sdpa_block_map **out);
void sdpa_block_map_free(sdpa_block_map *map);

/* Share of a map's (b, h, query block, key block) cells that are listed,
 * weighted by the keys they hold: 1 - density is the block sparsity. */
double sdpa_block_map_density(const sdpa_block_map *map, int64_t Sq, int64_t Skv);

/*
 * The part of a call's map that a piece of the call sees, as a map of its
 * own for a call on that piece alone: query rows [q_first, q_first +
 * q_count), keys [kv_first, kv_first + kv_count) and query heads
 * [head_first, head_first + head_count) of a call with Sq queries and Skv
 * keys. This is how a sequence-parallel rank hands a map to its local
 * attention (libsdpa_mpi and libsdpa.distributed cut maps this way). The
 * piece's blocks have the map's sizes, counted from its first row and key.
 * When q_first and kv_first are multiples of the block sizes, each is one
 * of the map's blocks, renumbered, its bits copied; otherwise a block of
 * the piece straddles up to four of the map's and comes out FULL, PARTIAL
 * with bits, or unlisted by what they show there (a PARTIAL block of a map
 * without bits counts as visible: the call's causal or window decides
 * inside, in the piece's call as in the whole). A map that broadcasts one
 * head stays broadcast. The rows read are validated as sdpa_forward
 * validates a map. Memory: the piece's listed blocks (and their bits).
 * Free the result with sdpa_block_map_free.
 */
sdpa_status sdpa_block_map_slice(const sdpa_block_map *map, int64_t Sq, int64_t Skv,
                                 int64_t q_first, int64_t q_count, int64_t kv_first,
                                 int64_t kv_count, int64_t head_first, int64_t head_count,
                                 sdpa_block_map **out);

/*
 * Per-call parameters. Start from SDPA_PARAMS_DEFAULT and set what you need.
 *
 *   scale          multiplies Q.K^T; 0 means 1/sqrt(D). Must be finite.
 *   causal         see sdpa_causal.
 *   deterministic  1: only backends that give bitwise-identical results for
 *                  identical inputs, whatever the thread count, may run.
 *   backend        explicit backend name for this call ("cpu.portable"), or
 *                  NULL. The highest-precedence choice: if that backend cannot
 *                  run the call, the call fails with SDPA_UNSUPPORTED and the
 *                  backend's reason; it is never replaced silently.
 *   layer_name     for messages only ("blocks.3.attn1").
 *   component      the model part ("transformer", "transformer_2",
 *                  "text_encoder"); selects per-component overrides and rules.
 *   quant          the model's quantisation format ("nvfp4", "fp8"), or NULL
 *                  for none; policy rules may match on it.
 *   stream         CUDA stream (cudaStream_t) for CUDA tensors; NULL = default.
 *   mask           padding, key and general masks (sdpa_mask), or NULL.
 */
typedef struct sdpa_params {
    size_t size; /* sizeof(sdpa_params) as the caller compiled it: the _DEFAULT macro
                  * sets it; 0 reads as the 0.2.0 layout (sdpa.h: growth) */
    double scale;
    sdpa_causal causal;
    int deterministic;
    const char *backend;
    const char *layer_name;
    const char *component;
    const char *quant;
    void *stream;
    const sdpa_mask *mask;
#ifdef SDPA_ABI_GROWTH_TEST /* scripts/abi-check.sh: a field added after 0.2.0 */
    int64_t abi_growth_test; /* 8-aligned: it starts after 0.2.0's sizeof, padding and all */
#endif
} sdpa_params;

#define SDPA_PARAMS_DEFAULT \
    {sizeof(sdpa_params), 0.0, SDPA_CAUSAL_NONE, 0, NULL, NULL, NULL, NULL, NULL, NULL}

/* ---------------------------------------------------------------- platform */

/* CPU features libsdpa's kernels care about (bit mask). */
enum {
    SDPA_CPU_AVX2 = 1u << 0,      /* with FMA3 and F16C */
    SDPA_CPU_AVX512F = 1u << 1,   /* with AVX512BW, VL, DQ */
    SDPA_CPU_AVX512BF16 = 1u << 2,
    SDPA_CPU_AVX512FP16 = 1u << 3,
    SDPA_CPU_AMX_BF16 = 1u << 4,  /* AMX-TILE + AMX-BF16, OS permission granted */
    SDPA_CPU_NEON = 1u << 5
};

/*
 * What the dispatcher decides for. By default read from the machine
 * (sdpa_platform_detect); a caller may inject another one, e.g. to see what
 * an sm_100 GPU would run (sdpa_platform_parse).
 */
typedef struct sdpa_platform {
    int simulated;                 /* 1: described, not read from this machine */
    /* CPU */
    char cpu_model[64];
    unsigned cpu_features;         /* SDPA_CPU_* usable on this platform       */
    unsigned cpu_features_present; /* in the silicon, before OS/limit checks   */
    int amx_permitted;             /* arch_prctl granted the AMX tile state    */
    int cpu_cores;                 /* online logical CPUs                      */
    /* CUDA (device 0 of the plugin, or the simulated one) */
    int cuda_present;              /* 1 if a CUDA device is described          */
    int cc_major, cc_minor;        /* compute capability                       */
    int cudnn_version;             /* e.g. 91900 for 9.19.0; 0 if none         */
    int sm_count;
    int64_t memory_bytes;
    int driver_version, runtime_version;
    char gpu_name[64];
    char cuda_why[160];            /* why no CUDA device is usable, if none    */
    /* Added in 0.2 (after the fields above, so callers that compiled
     * against 0.1 keep their offsets). */
    char cpu_vendor[16];           /* "intel", "amd", "other", or "" (not
                                    * known: a described CPU that did not say) */
    int cpu_family;                /* x86 CPUID display family (6: Intel cores,
                                    * 25: Zen 3/4, 26: Zen 5), 0 if not known */
    /* Added in 0.2.0. */
    char cpu_arch[16];             /* "x86_64", "aarch64": this build's, or the
                                    * one a described CPU's features belong to */
} sdpa_platform;

/*
 * Reads this machine: CPUID/XGETBV, AMX permission, core count, and CUDA
 * device 0 through the CUDA plugin (libsdpa_cuda.so beside libsdpa, or the
 * absolute path in SDPA_CUDA_PLUGIN; never the current directory). When no
 * device is usable, cuda_why says why.
 */
sdpa_status sdpa_platform_detect(sdpa_platform *out);

/*
 * Builds a platform from text:
 *   "cpu"                         this machine's CPU
 *   "cpu:isa=avx2"                this machine's CPU capped at an ISA level:
 *                                 portable | avx2 | avx512 | avx512bf16 | amx
 *                                 (avx512: fp32 only; avx512bf16 adds the
 *                                 BF16/FP16 extensions)
 *   "cpu:features=avx2+avx512+avx512bf16+amx-bf16"
 *                                 a described CPU with exactly these
 *                                 features (names as `sdpa info` prints
 *                                 them), whatever this machine has: for
 *                                 explain; kernels run only where present
 *   "cpu:vendor=intel,features=avx2+avx512+avx512bf16"
 *                                 the same, made by a vendor: intel | amd
 *                                 | other (rules may say `vendor`; a
 *                                 described CPU without it has none)
 *   "cpu:vendor=amd,family=25,features=avx2+avx512+avx512bf16"
 *                                 and of a CPUID display family (rules may
 *                                 say `family`; 25 with AVX-512: Zen 4)
 *   "cuda:sm_100"                 an sm_100 GPU (cuDNN 9.19.0 assumed)
 *   "cuda:sm_90,cudnn=91001"      an sm_90 GPU with cuDNN 9.10.1
 * Unknown words are an INVALID_ARGUMENT error naming them.
 */
sdpa_status sdpa_platform_parse(const char *spec, sdpa_platform *out);

/* ---------------------------------------------------------------- context */

typedef struct sdpa_context sdpa_context;

typedef enum sdpa_log_level {
    SDPA_LOG_ERROR = 0,
    SDPA_LOG_WARN = 1,
    SDPA_LOG_INFO = 2,
    SDPA_LOG_DEBUG = 3
} sdpa_log_level;

typedef void (*sdpa_log_fn)(sdpa_log_level level, const char *message, void *user);

/*
 * The caller's threads (libsdpa inside ggml, OpenMP, torch's intra-op pool):
 * a parallel-for that runs body(arg, t, worker) exactly once for every task
 * t in [0, n_tasks), each on a worker 0..threads-1 (the context's
 * `threads`) that runs no other task of this region at the same time, and
 * returns when all have finished. Tasks are independent (any order, any
 * thread); libsdpa never calls it from inside a task, and a context's
 * regions take turns on it (one at a time).
 */
typedef void (*sdpa_task_body)(void *arg, int64_t task, int worker);
typedef void (*sdpa_parallel_for_fn)(void *user, int64_t n_tasks, sdpa_task_body body,
                                     void *arg);

/*
 * Context options; start from SDPA_CONTEXT_OPTIONS_DEFAULT.
 *   platform     NULL: read this machine. Otherwise copied.
 *   log          NULL: messages at or above log_level go to stderr.
 *   log_level    -1: from SDPA_LOG (error|warn|info|debug), default warn.
 *   threads      CPU worker threads; 0: one per CPU this process may run on
 *                (the online CPUs, or fewer where an affinity mask or a
 *                cgroup CPU quota holds it: taskset, a container's cpuset
 *                or --cpus, a Kubernetes CPU limit).
 *   policy_file  user rule file (precedence over the built-in rules); NULL:
 *                from SDPA_POLICY if set.
 *   ignore_env   1: do not read SDPA_BACKEND, SDPA_POLICY, SDPA_LOG, SDPA_MAX_ISA,
 *                SDPA_POLICY_FOREIGN.
 *   foreign_policy  what to do with a rule file whose `require` lines name
 *                another CPU or libsdpa version (a tuned file from elsewhere):
 *                0 refuse it (INVALID_ARGUMENT saying why), 1 load it with a
 *                warning. SDPA_POLICY_FOREIGN=refuse|warn sets it too.
 *   share_pool   0: the context starts workers of its own; 1: it uses the
 *                process-wide pool of its width, shared with every other
 *                context that asks, so a process with many contexts keeps
 *                one set of threads (their parallel calls then take turns).
 *                bench/contexts.c, 2 busy contexts on 2 cores
 *                (bench/results/2026-11-29-contexts.txt): private pools
 *                0.81-0.96x the time of the same calls in series, shared
 *                1.01-1.09x (private wins most on small calls).
 *   parallel_for, parallel_for_user  NULL: libsdpa's own workers. Else
 *                every call of the context runs its tasks through this
 *                (sdpa_parallel_for_fn) on the caller's `threads` workers
 *                (0: one per online CPU), and libsdpa starts no thread;
 *                share_pool is then ignored.
 * Environment values are validated: an unknown backend in SDPA_BACKEND or a
 * bad SDPA_LOG fails context creation with INVALID_ARGUMENT.
 */
typedef struct sdpa_context_options {
    size_t size; /* sizeof(sdpa_context_options) as the caller compiled it: the _DEFAULT macro
                  * sets it; 0 reads as the 0.2.0 layout (sdpa.h: growth) */
    const sdpa_platform *platform;
    sdpa_log_fn log;
    void *log_user;
    int log_level;
    int threads;
    const char *policy_file;
    int ignore_env;
    int foreign_policy;
    int share_pool;
    sdpa_parallel_for_fn parallel_for;
    void *parallel_for_user;
#ifdef SDPA_ABI_GROWTH_TEST /* scripts/abi-check.sh: a field added after 0.2.0 */
    int64_t abi_growth_test; /* 8-aligned: it starts after 0.2.0's sizeof, padding and all */
#endif
} sdpa_context_options;

#define SDPA_CONTEXT_OPTIONS_DEFAULT \
    {sizeof(sdpa_context_options), NULL, NULL, NULL, -1, 0, NULL, 0, 0, 0, NULL, NULL}

sdpa_status sdpa_context_create(const sdpa_context_options *opts, sdpa_context **out);
void sdpa_context_destroy(sdpa_context *ctx);

/*
 * Host threads from an OpenMP runtime already in the process: GNU libgomp
 * (which PyTorch's Linux wheels load), or LLVM's libomp or Intel's
 * libiomp5 (both carry GNU's entry points). Fills *fn and *user for
 * sdpa_context_options' parallel_for and parallel_for_user, so that the
 * context's regions run on that runtime's team of at most `threads`
 * (pass the same count as the options' threads). Why: OpenMP workers
 * spin for a while after each of the host's parallel regions (GNU's
 * default, up to milliseconds), and a second pool started beside them
 * shares the cores with threads that only wait; on the host's own team
 * libsdpa's tasks run on the threads that were spinning. Nothing is
 * loaded or started: NOT_AVAILABLE when no such runtime is in the process
 * (or the platform has no dynamic loader), INVALID_ARGUMENT for threads
 * < 1. Called from inside a parallel region of the host, a region runs
 * on that one thread (OpenMP's nesting rules).
 */
sdpa_status sdpa_openmp_host(int threads, sdpa_parallel_for_fn *fn, void **user);

/* The platform the context decides for. */
const sdpa_platform *sdpa_context_platform(const sdpa_context *ctx);
int sdpa_context_threads(const sdpa_context *ctx);

/*
 * Loads a user rule file; its rules are tried before earlier user rules and
 * before the built-in ones. Parse errors name the file, the line and the
 * problem, and leave the context's rules unchanged. Layers re-decide on
 * their next call.
 */
sdpa_status sdpa_context_load_policy(sdpa_context *ctx, const char *path);
/* The same from text; `origin` names it in messages. */
sdpa_status sdpa_context_load_policy_text(sdpa_context *ctx, const char *text,
                                          const char *origin);

/*
 * Wisdom: rules measured on this machine by `sdpa tune --install`, which
 * every context loads at creation (not with opts->ignore_env) after the
 * built-in rules and before SDPA_POLICY / opts->policy_file. Lookup:
 * SDPA_WISDOM=PATH names the only file ("none": no wisdom); otherwise
 * ~/.config/libsdpa/wisdom.rules ($XDG_CONFIG_HOME/libsdpa/... when set)
 * is tried before the system's <sysconfdir>/libsdpa/wisdom.rules. A file
 * whose `require` lines do not match this CPU, ISA and libsdpa version is
 * ignored (logged at info level), one that does not parse is ignored with
 * a warning. This returns what happened, a line per file ("in force PATH",
 * "ignored PATH: why") or why there is none; owned by the context.
 */
const char *sdpa_context_wisdom(const sdpa_context *ctx);
/* The wisdom file of this user (system = 0) or of the system (1), as the
 * lookup above names it; "" when neither XDG_CONFIG_HOME nor HOME is set. */
void sdpa_wisdom_path(int system, char *buf, size_t n);

/*
 * The environment variables libsdpa reads, for help texts: the i-th one's
 * name, its accepted values and what it does (values and meaning may be
 * NULL); NULL for i past the last. A context reads them all once, when it
 * is created (unless opts->ignore_env); SDPA_CUDA_PLUGIN is read when the
 * first context loads the plugin. Nothing reads them per call.
 */
const char *sdpa_env_variable(int i, const char **values, const char **meaning);

/*
 * The finite-output guard, off by default (SDPA_FINITE_GUARD=1 turns it on
 * for contexts that read the environment). When on, a CPU call whose q, k
 * and v are finite but whose output holds NaN or Inf (or whose LSE holds
 * NaN or +inf) runs again on the next candidate that can take it (down to
 * ref, whose result is kept whatever it holds); the backend that gave it
 * is latched off (for the layer, or for the context's one-shot calls) with
 * one warning naming it and the shape, and the event is counted
 * (sdpa_context_guard_events; `sdpa info` and `sdpa explain` print it).
 * Out-of-memory and device errors reach the caller as ever. Not applied to
 * CUDA outputs, to ref's own result, nor to sdpa_forward_share (a share
 * cannot see the other shares' rows). Cost: one read of the output per
 * call (README: the guard's cost, measured), the inputs only after a bad
 * output.
 */
sdpa_status sdpa_context_set_finite_guard(sdpa_context *ctx, int on);
/* Calls the guard re-ran since the context was created. */
int64_t sdpa_context_guard_events(const sdpa_context *ctx);

/* Per-component override: calls and layers whose component equals
 * `component` use `backend` (NULL removes the override). */
sdpa_status sdpa_context_set_component_backend(sdpa_context *ctx, const char *component,
                                               const char *backend);

/* ---------------------------------------------------------------- overrides */

/*
 * Scoped override, the C analogue of a Python context manager. Per thread:
 * a push on one thread never affects another. The innermost push wins.
 *
 *   sdpa_override_push("cpu.portable");   // e.g. while building a quantised model
 *     ... create layers, call sdpa_forward ...
 *   sdpa_override_pop();
 *
 * An override active when a layer is created is captured by the layer and
 * keeps applying to its calls after the pop, on every thread. An override
 * active on the thread that calls a layer applies to that call only (it
 * beats the layer's captured override, its component override and
 * SDPA_BACKEND, not a backend given in its sdpa_layer_desc); it is never
 * remembered by the layer, so other threads and later calls are not
 * affected. Depth is at most 16. Backend names are checked when a decision
 * uses them.
 */
sdpa_status sdpa_override_push(const char *backend);
sdpa_status sdpa_override_pop(void);
/* The innermost override on this thread, or NULL. */
const char *sdpa_override_current(void);

/* ---------------------------------------------------------------- running */

/*
 * One attention forward:  out = softmax(scale * q k^T + mask) v, per head.
 *
 *   q    [B, Sq,  Hq,  D]  f32 | f16 | bf16, strided
 *   k    [B, Skv, Hkv, D]  f32 | f16 | bf16, strided
 *   v    [B, Skv, Hkv, D]  k's dtype, strided
 *        q's dtype may differ from k's (mixed: f32 queries over f16 or bf16
 *        keys and values, as stable-diffusion.cpp keeps them); only the
 *        backends that convert each input while packing take such a call
 *        (sdpa_backend_info.mixed_dtypes), the others are passed over with
 *        that reason.
 *   out  [B, Sq,  Hq,  D]  f32 | f16 | bf16 (any; converted on store), strided
 *   lse  [B, Hq, Sq] float32 contiguous, natural log of the softmax
 *        denominator: lse = log(sum_j exp(scale * q.k_j)); NULL if not wanted.
 *        A call that passes lse only runs on backends that produce it.
 *
 * Must agree: B everywhere; D everywhere; Skv and Hkv between k and v;
 * out's sizes equal q's. Hq % Hkv == 0 (query head h reads kv head
 * h / (Hq/Hkv): grouped-query and multi-query attention). Sq and Skv are free
 * (cross-attention). All tensors on one device; out and lse must not overlap
 * any input or each other.
 *
 * Non-finite values, on every backend (as torch's softmax treats them).
 * Scores s_j = scale * q.k_j are formed in float32 range: a score beyond
 * it is +-inf (ref computes in float64, then applies the same rule).
 *   - A row with a NaN or +inf score among the keys it may see gets NaN in
 *     all D outputs and LSE NaN (softmax of +inf is inf - inf = NaN).
 *     NaN or Inf in q or k therefore poisons exactly the rows that read it.
 *   - -inf scores weigh nothing; a row whose visible scores are all -inf
 *     is a masked row: zeros and LSE -inf, as a row that sees no key.
 *   - When terms of opposite signs overflow inside one dot product, float32
 *     arithmetic makes the score NaN where float64 may see a huge finite
 *     value: such rows may be NaN on one backend and +-inf-scored on
 *     another; what rows a NaN touches is then summation-order dependent.
 *   - NaN or Inf in v reaches, by IEEE arithmetic, the output column of
 *     every row that may see that key; rows that may not see it (causal)
 *     are unaffected on ref and may be NaN on the tiled kernels (0 * NaN).
 *   Finite inputs with finite scores never give NaN, whatever the scale.
 *
 * Errors: INVALID_ARGUMENT (nothing written), UNSUPPORTED (an explicitly
 * chosen backend cannot run this call, or no candidate can), NOT_AVAILABLE,
 * OUT_OF_MEMORY and DEVICE_ERROR from the backend that ran (never hidden),
 * INTERNAL.
 */
sdpa_status sdpa_forward(sdpa_context *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                         const sdpa_params *params);

/*
 * One share of an sdpa_forward call, for n threads of the caller that each
 * compute part of it (ggml's custom operators call every thread with
 * ith, nth): share = 0..shares-1. The call is cut exactly as for a context
 * of `shares` threads, and this share computes the tasks t with
 * t % shares == share on the calling thread, starting no thread and
 * waiting on no other share; when every share has returned OK, out and lse
 * hold bitwise what sdpa_forward gives on a context with threads = shares
 * (same backend, which the decision makes the same for every share: it
 * depends on the call and the context only, and a share whose backend
 * refuses is not run on another, it fails). What is shared: nothing
 * written; each share packs the K/V blocks its own tasks read (the tiled
 * kernels pack per task anyway). Arguments as sdpa_forward's, checked the
 * same way by every share; backends that take shares say so
 * (sdpa_backend_info.shares: not cpu.amx, whose packing is one region
 * that the next reads, nor CUDA).
 */
sdpa_status sdpa_forward_share(sdpa_context *ctx, int share, int shares, const sdpa_tensor *q,
                               const sdpa_tensor *k, const sdpa_tensor *v, sdpa_tensor *out,
                               float *lse, const sdpa_params *params);

/*
 * The backward pass of one sdpa_forward call: from dout = dL/d(out), the
 * gradients dq = dL/dq, dk = dL/dk and dv = dL/dv.
 *
 *   q, k, v   the forward's inputs, as passed to it
 *   out       the forward's output, as it returned it (any dtype, strided)
 *   lse       the forward's LSE [B, Hq, Sq] float32 (required: the softmax
 *             is recomputed block by block from q, k and it, so no
 *             Sq x Skv buffer exists)
 *   dout      [B, Sq, Hq, D]  any dtype, strided
 *   dlse      [B, Hq, Sq] float32, the LSE's own gradient when the caller
 *             used the LSE (merging ring steps, sdpa_merge), or NULL (zero)
 *   dq        [B, Sq, Hq, D], dk and dv [B, Skv, Hkv, D]: outputs of any
 *             dtype, strided, every element written (fp32 accumulation,
 *             converted on store)
 *   params    the forward's: scale, causal, mask; deterministic; backend,
 *             layer_name, component, quant choose and name as for the forward
 *
 * Grouped-query: dk and dv of a KV head sum over the query heads that read
 * it. Masks carry no gradient (an additive mask is a constant). A key that
 * no query may see gets zero dk and dv, a query row that sees no key (or a
 * padding row) zero dq. dq, dk, dv must not overlap each other or any
 * input. Dispatch, explain and latch work as for the forward; a backend
 * takes part only where it declares a backward pass
 * (sdpa_backend_info.backward), and rules may match on it (`pass backward`).
 * deterministic = 1: only backends whose gradients are bitwise identical
 * for identical inputs whatever the thread count (every CPU backward here).
 * Errors as sdpa_forward's; on INVALID_ARGUMENT nothing is written, and a
 * backend allocates before it writes, so OUT_OF_MEMORY leaves the outputs
 * as they were too.
 */
sdpa_status sdpa_backward(sdpa_context *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                          const sdpa_tensor *v, const sdpa_tensor *out, const float *lse,
                          const sdpa_tensor *dout, const float *dlse, sdpa_tensor *dq,
                          sdpa_tensor *dk, sdpa_tensor *dv, const sdpa_params *params);

/* Name of the backend that ran the last successful call on this thread. */
const char *sdpa_last_backend(void);

/*
 * Merges two partial results of one attention call, computed over disjoint
 * sets of keys (halves of a sequence, a ring step, text tokens attended
 * apart): (o_a, lse_a) and (o_b, lse_b) -> (out, lse), as if the call had
 * seen both sets. The LSEs are float32 [B, Hq, Sq] (sdpa_forward's layout,
 * natural log); the tensors any dtype and strides, all the same sizes, on
 * the CPU. Computed in float32, stably (the larger LSE factored out, log1p
 * of the exponent of the difference), symmetric in a and b (merge(a, b) ==
 * merge(b, a) bitwise). A side whose LSE is -inf saw no key (empty or fully
 * masked) and is not read; both -inf gives zeros and LSE -inf, never NaN; a
 * NaN or +inf LSE gives a NaN row. out may be o_a or o_b itself (the same
 * view: running accumulation), else must not overlap them; lse likewise
 * lse_a or lse_b, or separate, or NULL when not wanted.
 */
sdpa_status sdpa_merge(const sdpa_tensor *o_a, const float *lse_a, const sdpa_tensor *o_b,
                       const float *lse_b, sdpa_tensor *out, float *lse);

/* ---------------------------------------------------------------- layers */

typedef struct sdpa_layer sdpa_layer;

/*
 * A layer handle is built once per attention module, like the attention
 * layer object of a model. At creation it resolves where its choice comes
 * from, in precedence order:
 *   1. desc->backend (explicit for this layer)
 *   2. the innermost scoped override on the creating thread
 *   3. the context's override for desc->component
 *   4. SDPA_BACKEND from the environment (read at context creation)
 *   5. the policy rules, evaluated per call shape (cached per shape class)
 *   6. the built-in fallback chain
 * A per-call params->backend still beats all of these, and a scoped
 * override on the calling thread beats 2-6 for that call (see
 * sdpa_override_push). Decisions from 3-6 are cached per shape class;
 * decisions made under a caller's override are not.
 *
 * If a backend chosen by 5/6 answers UNSUPPORTED while running, the layer
 * latches it off for itself (thread-safe), logs one warning naming the
 * layer, the backend and the reason, and runs the next candidate in the same
 * call. OUT_OF_MEMORY, DEVICE_ERROR, INVALID_ARGUMENT and INTERNAL are
 * returned unchanged and latch nothing. Backends chosen by 1-4 are never
 * replaced: their UNSUPPORTED is returned.
 */
typedef struct sdpa_layer_desc {
    size_t size; /* sizeof(sdpa_layer_desc) as the caller compiled it: the _DEFAULT macro
                  * sets it; 0 reads as the 0.2.0 layout (sdpa.h: growth) */
    const char *name;      /* "blocks.3.attn1"; for messages               */
    const char *component; /* "transformer", "text_encoder", ...            */
    const char *backend;   /* explicit backend for this layer, or NULL      */
    const char *quant;     /* model quantisation format, or NULL            */
#ifdef SDPA_ABI_GROWTH_TEST /* scripts/abi-check.sh: a field added after 0.2.0 */
    int64_t abi_growth_test; /* 8-aligned: it starts after 0.2.0's sizeof, padding and all */
#endif
} sdpa_layer_desc;

#define SDPA_LAYER_DESC_DEFAULT {sizeof(sdpa_layer_desc), NULL, NULL, NULL, NULL}

sdpa_status sdpa_layer_create(sdpa_context *ctx, const sdpa_layer_desc *desc,
                              sdpa_layer **out);
void sdpa_layer_destroy(sdpa_layer *layer);

/* As sdpa_forward; params->component and ->quant are ignored (the layer's
 * own are used), params->backend still overrides. */
sdpa_status sdpa_layer_forward(sdpa_layer *layer, const sdpa_tensor *q, const sdpa_tensor *k,
                               const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                               const sdpa_params *params);

/*
 * Warm-up: does now, without computing anything, what the first forward
 * call with these tensors would do before computing: decide (exactly as
 * the forward call would, same precedence and cache), start the CPU worker
 * threads, and let the chosen backend build what it builds on first use.
 * For cuda.cudnn that is the execution plan (cuDNN compiles kernels:
 * seconds) and this thread's workspace; CPU backends build nothing. The
 * tensors are validated as for forward but their data is neither read nor
 * written. A backend that refuses the shape here is latched off for the
 * layer (one warning) and the next candidate is prepared, as forward
 * would; errors are returned as forward returns them. sdpa_last_backend()
 * then names the backend the forward call will run.
 */
sdpa_status sdpa_layer_warmup(sdpa_layer *layer, const sdpa_tensor *q, const sdpa_tensor *k,
                              const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                              const sdpa_params *params);
sdpa_status sdpa_warmup(sdpa_context *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                        const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                        const sdpa_params *params);

/* As sdpa_backward, with the layer's choice, cache and latch (a backend
 * latched off for the layer's backward pass stays on for its forward, and
 * the other way round). */
sdpa_status sdpa_layer_backward(sdpa_layer *layer, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_tensor *v, const sdpa_tensor *out, const float *lse,
                                const sdpa_tensor *dout, const float *dlse, sdpa_tensor *dq,
                                sdpa_tensor *dk, sdpa_tensor *dv, const sdpa_params *params);

/* Whether the layer has latched `backend` off (1), for its forward or its
 * backward pass, or not (0). */
int sdpa_layer_is_latched(const sdpa_layer *layer, const char *backend);
/* The finite-output guard for this layer's calls: 1 on, 0 off, -1 as its
 * context says (the default). */
sdpa_status sdpa_layer_set_finite_guard(sdpa_layer *layer, int on);

/* ---------------------------------------------------------------- explain */

/* A call described without data: what explain and the tuner reason about. */
typedef struct sdpa_call_desc {
    size_t size; /* sizeof(sdpa_call_desc) as the caller compiled it: the _DEFAULT macro
                  * sets it; 0 reads as the 0.2.0 layout (sdpa.h: growth) */
    sdpa_device_kind device;
    sdpa_dtype dtype;
    int64_t B, Sq, Skv, Hq, Hkv, D;
    sdpa_causal causal;
    int want_lse;
    int deterministic;
    const char *backend;   /* explicit choice, or NULL */
    const char *component; /* or NULL */
    const char *quant;     /* or NULL */
    unsigned mask;         /* SDPA_MASK_KIND_* the call carries; 0: none */
    int backward;          /* 1: the backward pass (sdpa_backward) */
    int kv_dtype;          /* k and v's dtype when it is not q's (dtype):
                            * SDPA_KV_DTYPE(SDPA_F16); 0: the same as q's */
    int shares;            /* > 0: a share of a call cut into this many
                            * (sdpa_forward_share); 0: a whole call */
#ifdef SDPA_ABI_GROWTH_TEST /* scripts/abi-check.sh: a field added after 0.2.0 */
    int64_t abi_growth_test; /* 8-aligned: it starts after 0.2.0's sizeof, padding and all */
#endif
} sdpa_call_desc;

/* Start from this and set the fields the call has (f32, no mask: zeros). */
#define SDPA_CALL_DESC_DEFAULT                                                              \
    {sizeof(sdpa_call_desc), SDPA_DEVICE_CPU, SDPA_F32, 0, 0, 0, 0, 0, 0, SDPA_CAUSAL_NONE, 0, \
     0, NULL, NULL, NULL, 0, 0, 0, 0}

/* sdpa_call_desc.kv_dtype for k and v of dtype t (0 stays "as q", so
 * descriptions written before the field existed mean what they meant). */
#define SDPA_KV_DTYPE(t) ((int)(t) + 1)

#define SDPA_MAX_CANDIDATES 16
#define SDPA_MAX_BACKENDS 32

/* Where a decision came from. */
typedef enum sdpa_source {
    SDPA_SOURCE_EXPLICIT = 0,   /* params->backend or the layer's backend */
    SDPA_SOURCE_SCOPED = 1,     /* sdpa_override_push                      */
    SDPA_SOURCE_COMPONENT = 2,  /* sdpa_context_set_component_backend      */
    SDPA_SOURCE_ENVIRONMENT = 3,/* SDPA_BACKEND                            */
    SDPA_SOURCE_RULE = 4,       /* a policy rule matched                   */
    SDPA_SOURCE_FALLBACK = 5    /* no rule matched                         */
} sdpa_source;

const char *sdpa_source_name(sdpa_source s);

typedef struct sdpa_backend_verdict {
    const char *name;  /* backend name (static)                              */
    int candidate;     /* position in candidates, or -1 when passed over     */
    int present;       /* 1 if it can run on this machine                    */
    char reason[240];  /* why passed over, or why not present; "" otherwise  */
} sdpa_backend_verdict;

/*
 * A decision: the ordered backends that would be tried for the call on the
 * context's platform, and the verdict on every known backend. Candidates
 * that are not present on this machine (simulated platform) are listed, so
 * the decision that platform would make stays visible; running skips them.
 */
typedef struct sdpa_decision {
    sdpa_source source;
    char source_detail[128];        /* e.g. "SDPA_BACKEND=cpu.portable"    */
    char rule[64];                  /* matching rule's name, or ""          */
    char rule_origin[192];          /* "file:line" of the rule              */
    char evidence[512];             /* the rule's evidence note             */
    char rule_class[192];           /* the rule's shape class in words (a
                                     * tuned rule's `class`), or ""        */
    int n_candidates;
    const char *candidates[SDPA_MAX_CANDIDATES];
    int n_backends;
    sdpa_backend_verdict backends[SDPA_MAX_BACKENDS];
    sdpa_status status;             /* OK, or why nothing can run           */
    char error[256];
} sdpa_decision;

/*
 * Decides without running anything. Returns SDPA_OK and fills *out even
 * when no candidate remains (then out->status says why); returns
 * INVALID_ARGUMENT for a malformed description.
 */
sdpa_status sdpa_decide(sdpa_context *ctx, const sdpa_call_desc *desc, sdpa_decision *out);

/*
 * The decision as text for people (json = 0) or one JSON object (json = 1)
 * with keys platform, call, source, rule, evidence, candidates (ordered
 * names), present, rejected (name -> reason). Release *text with sdpa_free.
 */
sdpa_status sdpa_explain(sdpa_context *ctx, const sdpa_call_desc *desc, int json,
                         char **text);

/*
 * What the context sees, as `sdpa info` prints it (json = 0) or as one JSON
 * object (json = 1) with keys version, cpu {model, simulated, isa,
 * isa_unusable, amx, threads, cores, l2_bytes (per core; 0 where unknown
 * or simulated)}, cuda {present, name, cc, cudnn,
 * sm_count, memory_bytes | why}, kernel {call, backend, source, rule} (the
 * choice for a plain f32 call) and backends (name, version, summary,
 * device, dtypes, masks, head-dim range, capabilities, present,
 * why_absent). Release *text with sdpa_free.
 */
sdpa_status sdpa_info(sdpa_context *ctx, int json, char **text);

/*
 * The size of a public struct as this library was built ("sdpa_tensor",
 * "sdpa_params", "sdpa_mask", "sdpa_window", "sdpa_block_map",
 * "sdpa_neighborhood_3d", "sdpa_call_desc", "sdpa_layer_desc",
 * "sdpa_context_options"), or 0 for another name: a binding that mirrors
 * them (the Python package) checks its copies against the library it
 * loaded.
 */
size_t sdpa_struct_size(const char *name);

/* ---------------------------------------------------------------- backends */

/* Static description of a known backend, whether or not it is built here. */
typedef struct sdpa_backend_info {
    const char *name;
    const char *summary;
    sdpa_device_kind device;
    unsigned dtypes;        /* bit (1 << sdpa_dtype)                        */
    int head_dim_min, head_dim_max, head_dim_multiple;
    int gqa, cross, causal_top_left, causal_bottom_right, lse, deterministic;
    unsigned cpu_features;  /* SDPA_CPU_* required                          */
    unsigned masks;         /* SDPA_MASK_KIND_* it takes                    */
    int min_cc;             /* minimum compute capability * 10, or 0        */
    int product_bits;       /* significand bits of the operands of both
                             * products: 0 = the input dtype's (f32 inputs
                             * get fp32 products), 8 = rounded to bf16      */
    int backward;           /* 1: has a backward pass (sdpa_backward)       */
    int present;            /* can run on this machine                      */
    char why_absent[160];   /* if not present                               */
    const char *version;
    int mixed_dtypes;       /* 1: q's dtype may differ from k's and v's
                             * (converted while packing)                    */
    int shares;             /* 1: runs a share of a call (sdpa_forward_share) */
} sdpa_backend_info;

int sdpa_backend_count(const sdpa_context *ctx);
sdpa_status sdpa_backend_get(const sdpa_context *ctx, int index, sdpa_backend_info *out);

/* ---------------------------------------------------------------- evidence */

/* Median of x[0..n-1]; x is not modified. NaN when n < 1. */
double sdpa_median(const double *x, int n);

typedef enum sdpa_ab_verdict {
    SDPA_AB_TIE = 0,      /* the interval contains 1: no difference at this noise level */
    SDPA_AB_B_FASTER = 1,
    SDPA_AB_B_SLOWER = 2
} sdpa_ab_verdict;

typedef struct sdpa_ab_result {
    double median_a, median_b;
    double ratio;  /* median_b / median_a: below 1 means B is faster */
    double lo, hi; /* 95% bootstrap interval of the ratio */
    sdpa_ab_verdict verdict;
} sdpa_ab_result;

/*
 * a[i] and b[i] are the times of round i, measured side by side (paired).
 * The interval resamples rounds with replacement (2000 resamples, fixed
 * seed: the same samples always give the same answer). A verdict other
 * than TIE needs the interval to exclude 1 and the ratio to differ from 1
 * by at least min_gain (0.02 = 2%). With n < 1 every figure is NaN and
 * the verdict TIE.
 */
void sdpa_ab_compare(const double *a, const double *b, int n, double min_gain,
                     sdpa_ab_result *out);
const char *sdpa_ab_verdict_text(sdpa_ab_verdict v);

/*
 * The tuner: times candidate backends on rows of a shape suite, interleaved
 * and repeated, and writes policy rules for this platform over shape
 * classes, each with its evidence.
 *
 * Per row, the backends within the noise of the fastest form its tie set
 * (a backend is out when the 95% interval of its time ratio to the
 * fastest excludes 1 and it is at least min_gain slower). Rows of one
 * family (dtype, causal, mask kind, whether Sq == Skv and Hq == Hkv, D,
 * and for Sq != Skv whether Sq < 64: few queries against many keys)
 * are ordered by their keys (then queries); neighbouring rows whose tie
 * sets share a backend form one class, and that backend (the current
 * first choice when it is among them) wins it. Where two neighbours
 * share none, up to max_extra shapes between them are measured to place
 * the boundary (when they differ only in their sequence lengths). Classes
 * of different head dims with the same winner and the same sequence
 * ranges merge, D becoming a set. Each class becomes one rule over the
 * ranges of its rows (B, Sq, Skv, Hq, Hkv as ranges, D as a set, dtype,
 * causal, mask, same_seq and same_heads exactly): no rule claims lengths
 * beyond its first and last measured rows, and between classes, and
 * outside every class, the built-in rules apply. A rule's `class` line
 * says it in words, its `evidence` names the rows it rests on, with the
 * winner's margin, machine, versions and date; rows that could not be
 * measured are listed as comments. `require` lines bind the file to this
 * machine and library version (see sdpa_context_options.foreign_policy).
 *
 * Only CPU forward rows are timed in this release; CUDA rows are listed
 * as not measured.
 */
typedef struct sdpa_tune_row {
    const char *name;    /* for the rule name and evidence */
    sdpa_call_desc desc; /* desc.backend is ignored */
    int64_t seq_len_kv;  /* desc.mask has SDPA_MASK_KIND_SEQ_LEN: every batch
                          * entry's real keys (padding); else 0 */
} sdpa_tune_row;

typedef struct sdpa_tune_options {
    size_t size; /* sizeof(sdpa_tune_options) as the caller compiled it: the _DEFAULT macro
                  * sets it; 0 reads as the 0.2.0 layout (sdpa.h: growth) */
    const char *const *backends; /* candidates to time; NULL: every present one but ref */
    int n_backends;
    int reps;                    /* interleaved rounds; 0: 7 */
    double min_gain;             /* 0: 0.02 */
    double (*clock_ms)(void *user); /* NULL: the monotonic clock (tests inject a fake) */
    void *clock_user;
    void (*progress)(int row, int n_rows, void *user); /* NULL: silent */
    void *progress_user;
    int max_extra;               /* shapes measured per class boundary; 0: 2, -1: none */
#ifdef SDPA_ABI_GROWTH_TEST /* scripts/abi-check.sh: a field added after 0.2.0 */
    int64_t abi_growth_test; /* 8-aligned: it starts after 0.2.0's sizeof, padding and all */
#endif
} sdpa_tune_options;

#define SDPA_TUNE_OPTIONS_DEFAULT \
    {sizeof(sdpa_tune_options), NULL, 0, 0, 0.0, NULL, NULL, NULL, NULL, 0}

/* Writes the rule file text to *rules_text (release with sdpa_free). */
sdpa_status sdpa_tune(sdpa_context *ctx, const sdpa_tune_row *rows, int n_rows,
                      const sdpa_tune_options *opts, char **rules_text);

/* ---------------------------------------------------------------- ceilings */

/*
 * Measures an arithmetic ceiling of this machine with a short probe
 * (~0.2 s) over the context's threads, in GFLOP/s: what = "fp32" is the FMA
 * peak of the best usable vector ISA (12 register-only FMA chains per
 * thread, by the backend of the newest ISA present); a CPU feature's name
 * (as `sdpa info` lists them) the peak of that unit where a backend
 * declares a probe for it: "avx512bf16" the VDPBF16PS peak (12 chains per
 * thread; "avx512-bf16" is still accepted), "amx-bf16" the TDPBF16PS peak
 * (4 accumulator tiles per thread); NOT_AVAILABLE where the CPU cannot run
 * it. *isa, if not NULL, names the feature probed ("avx512", "neon", ...).
 * Benchmarks print their figures as a percentage of this, measured in the
 * same run.
 */
sdpa_status sdpa_measure_ceiling(sdpa_context *ctx, const char *what, double *gflops,
                                 const char **isa);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* SDPA_H */
