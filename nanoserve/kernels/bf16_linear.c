/* bf16_linear.c: bfloat16 products over weights packed once, on AMX tiles or AVX512-BF16 dot products.

   Computes  y = x @ w.T (+ b) in bfloat16 (float32 sums, rounded to nearest even) for any number of rows, or the
             float32 sums unrounded where the caller asks (the last argument, f32: an LM head's logits).
   Entry     amx_enable (asks Linux for the tile state), amx_packed_size and amx_pack (the build's packed layout),
             amx_linear (the product), amx_dot_rows (the most rows the dot products take); q8_packed_size, q8_pack
             and q8_linear, the same products over int8 weights with a scale a column, and q4_packed_size, q4_pack
             and q4_linear, over int4 weights with a scale and a zero a group (below); linear_many, many products of
             one shape in one call (a mixture of experts' experts, each over its own rows).
   Build     AMX_LINEAR_FLAGS in nanoserve/fast.py: -O3 -fopenmp -fPIC -shared -std=c11 (amx_kernel), as
             'amx_linear' (tiles, dot products for one row), 'amx_linear_tiles' (-DDOT_ROWS=0: the tiles at every row
             count, the batch-invariant build) or 'bf16_dot_linear' (-DNO_TILES: a CPU with AVX512-BF16 and no AMX).
             AHEAD, DOT_ROWS and DOT_AHEAD_ONE_ROW may be set with -D to measure other prefetch distances and splits.
   Checked   nbs/06_fast.ipynb, "AMX products" and "Checks against the reference": each build against F.linear and
             float64, and its rows' bits across row and thread counts;
             tests/test_fast.py::test_amx_products_greedy_text_equals_onednn; the int8 and int4 products in
             06_fast's cells after "int8 products", nbs/13_decode_call.ipynb, nbs/55_quant.ipynb and
             tests/test_quant.py; linear_many in nbs/06_grouped_experts.ipynb and tests/test_experts.py. */

/* bfloat16 products y = x @ w.T (+ b) on Intel's AMX tiles, over weights packed once.  Compiled for AMX whatever the
   machine (target attributes); called only where the CPU has it and Linux has granted this process the tile state
   (amx_enable). Built with NO_TILES, for a CPU with avx512bf16 but no AMX (AMD's Zen 4 and 5, Intel's Cooper Lake):
   every row count through the dot products, over blocks of 32 columns (the same layout, narrower), and no tile
   instruction in the library. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>
#include <omp.h>

#ifdef NO_TILES
/* output columns of a packed block: two vectors, so that a pass holds 12 rows' sums */
#define NB 32
/* rows of x a dot-product pass takes: 12 x 2 accumulators of the 32 registers */
#define PASS_ROWS 12
#else
#define NB 64                               /* output columns of a packed block: four 16-column tiles */
/* (4 x 4 accumulators: the AMX build's dot products take at most DOT_ROWS rows) */
#define PASS_ROWS 4
#endif
#define NV (NB / 16)                        /* vectors of 16 columns in a whole block */
#ifndef AHEAD                               /* bytes of a block ahead of its tile loads that the first pass asks for */
#define AHEAD 8192                          /* (0: none; bench/amx_prefetch.py builds the kernel so, to compare) */
#endif
#ifdef NO_TILES
#define DOT_ROWS (1 << 30)                  /* every product: there are no tiles */
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))
#endif
/* products of at most this many rows (up to 4) take avx512bf16's dot products, not the tiles (0: the tiles at every
   row count, as the invariant build does; 4: up to 4 rows, which bench/amx_dot.py builds to compare) */
#ifndef DOT_ROWS
#define DOT_ROWS 1
#endif
/* bytes of a block ahead of the dot products' loads that they ask the memory for */
#define DOT_AHEAD 4096
/* the same for a pass of one row: none without tiles (over weights on huge pages the hardware's own prefetch reads
   one row's stream faster, 1.06-1.17x on Zen 4; passes of more rows still gain from it); the AMX build's, unmeasured
   so, stays DOT_AHEAD */
#ifndef DOT_AHEAD_ONE_ROW
#ifdef NO_TILES
#define DOT_AHEAD_ONE_ROW 0
#else
#define DOT_AHEAD_ONE_ROW DOT_AHEAD
#endif
#endif
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ask Linux for the tile state: once per process is enough, again is harmless */
int amx_enable(void) {
#ifdef NO_TILES
    return 0;                               /* nothing to ask for */
#else
    return (int)syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
#endif
}

/* w [N, K] -> blocks of NB output columns (64, or 32 without tiles; 16-48 in the last, columns past N zeros), each
   [K/2][NB][2]: a pair of inputs of every column side by side, the layout tdpbf16ps reads a weight tile in.  K must
   be a multiple of 32.  A build reads only what its own amx_pack wrote: the two builds' blocks differ in width, not
   in size. */
int64_t amx_packed_size(int64_t N, int64_t K) { return (N + 15) / 16 * 16 * K; }
int amx_block_cols(void) { return NB; }

/* the blocks of w [N, K] (elements of es bytes: 2, or 1 for the int8 layout) into p, columns past N zeros */
static inline __attribute__((always_inline)) void pack_blocks(const char *w, char *p, int64_t N, int64_t K,
                                                              const int es) {
    int64_t Np = (N + 15) / 16 * 16;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < (Np + NB - 1) / NB; b++) {
        int64_t n0 = b * NB, nb = min64(NB, Np - n0);
        for (int64_t k = 0; k < K / 2; k++)
            for (int64_t j = 0; j < nb; j++)
                for (int64_t d = 0; d < 2; d++) {
                    int64_t to = n0 * K + (k * nb + j) * 2 + d, from = (n0 + j) * K + 2 * k + d;
                    if (es == 2) ((uint16_t *)p)[to] = n0 + j < N ? ((const uint16_t *)w)[from] : 0;
                    else p[to] = n0 + j < N ? w[from] : 0;
                }
    }
}

void amx_pack(const uint16_t *w, uint16_t *p, int64_t N, int64_t K) {
    pack_blocks((const char *)w, (char *)p, N, K, 2);
}

typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg;

/* element i of an output: bfloat16, or float32 where the caller asked for its sums unrounded (f32: an LM head's
   logits) */
#define OUT_AT(out, i, f32) ((char *)(out) + (i) * ((f32) ? 4 : 2))

/* float32 results c [rows][64] -> out (times scale, + bias), the first ncols columns: bfloat16 rounded to nearest
   even, or with f32 the float32 values as they are; scale (an int8 weight's, one a column) or null */
TGT static void store_rows(void *out, int64_t ldo, const float *c, int64_t rows, int64_t ncols,
                           const uint16_t *bias, const float *scale, const int f32) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < ncols; j += 16) {
            __mmask16 m = ncols - j >= 16 ? 0xffff : (__mmask16)((1u << (ncols - j)) - 1);
            __m512 v = _mm512_loadu_ps(c + r * NB + j);
            if (scale) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, scale + j));
            if (bias) {
                __m512i bw = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, bias + j));
                v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(bw, 16)));
            }
            if (f32) _mm512_mask_storeu_ps((float *)out + r * ldo + j, m, v);
            else _mm256_mask_storeu_epi16((uint16_t *)out + r * ldo + j, m, (__m256i)_mm512_cvtneps_pbh(v));
        }
}

int amx_dot_rows(void) { return DOT_ROWS; }

/* mr (up to PASS_ROWS) rows of x against one block of nv vectors with vdpbf16ps, reading the packed layout: for each
   pair of inputs, the block's nv * 16 columns x 2 (nv * 64 bytes, front to back) as nv vectors, against each row's
   pair broadcast.  xt is x with its pairs transposed ([K/2][ldx] 32-bit words), so a pass's rows of one pair sit
   side by side behind one pointer; with a pointer a row, 12 rows did not fit the general registers and the compiler
   reloaded them from the stack.  Each output is one float32 sum over the pairs in order (vdpbf16ps adds a pair's two
   products one after the other), so a row's bits do not depend on the other rows, the passes or the threads; they
   are not the tiles' bits, which round inside a tile in their own way. */
/* 32 int8 -> 32 bfloat16, in order, exactly (the int8 products below) */
TGT static inline __m512bh q8_bf16(const int8_t *q) {
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
    return _mm512_cvtne2ps_pbh(hi, lo);
}

/* (q8, a constant at each call: the block holds int8 codes, a byte an element, widened to bfloat16 as they are read,
   and scale then multiplies each column's sums; see the int8 products below) */
TGT static inline __attribute__((always_inline)) void dot_pass(const int32_t *xt, int64_t ldx, int64_t K,
        const void *blk, void *out, int64_t ldo, int64_t ncols, const uint16_t *bias, const float *scale,
        const int mr, const int nv, const int q8, const int f32) {
    __m512 acc[PASS_ROWS][NV];
    float c[PASS_ROWS * NB] __attribute__((aligned(64)));
    for (int r = 0; r < mr; r++) for (int j = 0; j < nv; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K / 2; k++) {
        /* a pair of inputs' weights: nv vectors of 64 bytes (bfloat16), or of 32 (int8) */
        const char *w = (const char *)blk + k * nv * (q8 ? 32 : 64);
        const int32_t *a = xt + k * ldx;
        if (nv == NV && (mr > 1 || (DOT_AHEAD_ONE_ROW && !q8)))
            for (int l = 0; l < NB * (q8 ? 2 : 4); l += 64)
                _mm_prefetch(w + (q8 ? DOT_AHEAD / 2 : mr > 1 ? DOT_AHEAD : DOT_AHEAD_ONE_ROW) + l, _MM_HINT_T0);
        __m512bh wv[NV];
        for (int j = 0; j < nv; j++)
            wv[j] = q8 ? q8_bf16((const int8_t *)w + 32 * j) : (__m512bh)_mm512_loadu_si512(w + 64 * j);
        for (int r = 0; r < mr; r++) {
            __m512bh b = (__m512bh)_mm512_set1_epi32(a[r]);
            for (int j = 0; j < nv; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], b, wv[j]);
        }
    }
    for (int r = 0; r < mr; r++) for (int j = 0; j < nv; j++) _mm512_store_ps(c + r * NB + 16 * j, acc[r][j]);
    store_rows(out, ldo, c, mr, ncols, bias, scale, f32);
}
/* a pass of n rows (its panel starts m * K/2 words in): a whole block with nv known to the compiler, the last one
   (fewer columns) with nv as it comes; an int8 block widened as read, or (past one pass) from its widened scratch */
#define PASS(n) case n: \
    if (scratch && nb == NB) dot_pass(xt + m * K2, ld, K, scratch, OUT_AT(out, m * N + n0, f32), N, \
                                      min64(nb, N - n0), bias ? bias + n0 : 0, sc, n, NV, 0, f32); \
    else if (scratch) dot_pass(xt + m * K2, ld, K, scratch, OUT_AT(out, m * N + n0, f32), N, min64(nb, N - n0), \
                               bias ? bias + n0 : 0, sc, n, (int)(nb / 16), 0, f32); \
    else if (nb == NB) dot_pass(xt + m * K2, ld, K, blk, OUT_AT(out, m * N + n0, f32), N, min64(nb, N - n0), \
                                bias ? bias + n0 : 0, sc, n, NV, q8, f32); \
    else dot_pass(xt + m * K2, ld, K, blk, OUT_AT(out, m * N + n0, f32), N, min64(nb, N - n0), \
                  bias ? bias + n0 : 0, sc, n, (int)(nb / 16), q8, f32); break;

/* each thread's scratch block for the int8 products, grown to the widest asked for and kept; null when out of
   memory */
static uint16_t *q8_scratch(int64_t n) {
    static __thread uint16_t *buf;
    static __thread int64_t cap;
    if (n > cap) {
        free(buf);
        cap = (n + 4095) / 4096 * 4096;
        if (!(buf = aligned_alloc(64, cap * 2))) cap = 0;
    }
    return buf;
}

/* A product of one row reads each weight once whatever it does with it, and the dot products keep more of the
   memory's rate than the tiles (which load a 16-row tile of x that is all zeros but one row, and 16 weight rows 256
   bytes apart).  The blocks are split across threads as the tiles split them; rows go in passes of up to PASS_ROWS,
   each over the block: the first reads it from memory, the later ones find it in cache.  Without tiles a pass of 12
   rows has enough arithmetic to cover the first one's memory stream, where a pass of 4 waited on it.  x goes in
   panels of PASS_ROWS rows, each with its pairs transposed ([K/2][PASS_ROWS] words), so a pass reads its rows front
   to back: with one transpose of all M rows a pass read K/2 lines M * 4 bytes apart, a page each at a prefill's
   1,024 rows, and ran at 40% of oneDNN's rate there.  1 when out of memory.
   With q8 (a constant at each call), w is an int8 layout's blocks and scale its columns' scales (the int8 products
   below); past PASS_ROWS rows each int8 block is widened once into the thread's scratch block for all its passes
   (1 too when that cannot be had). */
TGT static inline __attribute__((always_inline)) int dot_products(const uint16_t *x, const void *w, const float *scale,
        const uint16_t *bias, void *out, int64_t M, int64_t N, int64_t K, int nthreads, const int q8, const int f32) {
    int64_t Np = (N + 15) / 16 * 16, nblocks = (Np + NB - 1) / NB, K2 = K / 2;
    const int32_t *xd = (const int32_t *)x;              /* a pair of bfloat16 inputs as one 32-bit word */
    int32_t *xt = (int32_t *)xd;                         /* one row is its own transpose */
    int64_t ld = M > 1 ? PASS_ROWS : 1;                 /* words from one pair of a pass's rows to the next */
    int64_t panels = (M + PASS_ROWS - 1) / PASS_ROWS;
    if (M > 1 && !(xt = malloc(panels * PASS_ROWS * K2 * 4))) return 1;
    /* rows in chunks of as many as 512 KiB of x hold, each chunk over every block: a chunk's panels stay in cache while
       the blocks stream by (a prefill's thousands of rows were read once a block: 7% behind oneDNN at 4,096) */
    int64_t mc = (1 << 19) / (K * 2) / PASS_ROWS * PASS_ROWS;
    if (mc < PASS_ROWS) mc = PASS_ROWS;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        if (M > 1) {          /* the panels, a share of them each thread (4,096 rows took 5% of the product on one) */
            for (int64_t q = panels * t / nt; q < panels * (t + 1) / nt; q++)
                for (int64_t m = q * PASS_ROWS; m < min64(M, (q + 1) * PASS_ROWS); m++)
                    for (int64_t k = 0; k < K2; k++)
                        xt[q * PASS_ROWS * K2 + k * PASS_ROWS + m % PASS_ROWS] = xd[m * K2 + k];
            _Pragma("omp barrier")
        }
        uint16_t *scratch = q8 && M > PASS_ROWS ? q8_scratch(K * NB) : 0;
        if (q8 && M > PASS_ROWS && !scratch) {
            _Pragma("omp atomic write")
            failed = 1;
        }
        else
            for (int64_t c0 = 0; c0 < M; c0 += mc)
                for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
                    int64_t n0 = b * NB, nb = min64(NB, Np - n0);
                    const void *blk = (const char *)w + n0 * K * (q8 ? 1 : 2);
                    const float *sc = scale ? scale + n0 : 0;
                    if (scratch)
                        for (int64_t i = 0; i < K * nb; i += 32)
                            _mm512_store_si512(scratch + i, (__m512i)q8_bf16((const int8_t *)blk + i));
                    for (int64_t m = c0; m < min64(M, c0 + mc); m += PASS_ROWS)
                        switch (min64(PASS_ROWS, M - m)) { PASS(1) PASS(2) PASS(3) PASS(4)
#if PASS_ROWS > 4
                            PASS(5) PASS(6) PASS(7) PASS(8) PASS(9) PASS(10) PASS(11) PASS(12)
#endif
                        }
                }
    }
    if (xt != xd) free(xt);
    return failed;
}
TGT static int dot_linear(const uint16_t *x, const uint16_t *p, const uint16_t *bias, void *out, int64_t M,
                          int64_t N, int64_t K, int nthreads, const int f32) {
    return dot_products(x, p, 0, bias, out, M, N, K, nthreads, 0, f32);
}

/* Tiles: 0-3 results (float32, 16 x 16), 4-5 x (16 rows x 32 inputs), 5-7 weights (16 pairs of inputs x 16 columns).
   Up to 16 rows: one tile of x (its missing rows zeros) against the block's four weight tiles.  More: x in pairs of
   16-row tiles against two weight tiles at a time, so each weight tile loaded from memory serves 32 rows.  The
   blocks are split across threads; each row's sums run in the same order whatever the number of rows (past DOT_ROWS)
   or threads.  Up to DOT_ROWS: dot_linear.  out is bfloat16 [M, N], or float32 with f32 (the sums unrounded). */
TGT int amx_linear(const uint16_t *x, const uint16_t *p, const uint16_t *bias, void *out, int64_t M, int64_t N,
                   int64_t K, int nthreads, int f32) {
    if (K % 32) return 2;
    if (M <= DOT_ROWS) return dot_linear(x, p, bias, out, M, N, K, nthreads, f32);
#ifndef NO_TILES                            /* (the build without tiles took every row count above) */
    int64_t Np = (N + 15) / 16 * 16, nblocks = (Np + NB - 1) / NB, Mp = M <= 16 ? 16 : (M + 31) / 32 * 32;
    uint16_t *xp = (uint16_t *)x;
    if (Mp != M) {
        if (!(xp = aligned_alloc(64, Mp * K * 2))) return 1;
        memcpy(xp, x, M * K * 2); memset(xp + M * K, 0, (Mp - M) * K * 2);
    }
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        tilecfg cfg = {0}; cfg.palette = 1;
        for (int i = 0; i < 8; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
        _tile_loadconfig(&cfg);
        float c[32 * NB] __attribute__((aligned(64)));
        for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
            /* bytes from one pair of inputs to the next */
            int64_t n0 = b * NB, nb = min64(NB, Np - n0), ldb = nb * 4;
            const uint16_t *blk = p + n0 * K;
            if (Mp == 16) {
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                for (int64_t k = 0; k < K; k += 32) {
                    const uint16_t *bk = blk + k * nb;      /* 32 inputs of the block: nb * 64 bytes, front to back */
                    if (AHEAD)
                        for (int64_t l = 0; l < nb * 64; l += 64)
                            _mm_prefetch((const char *)bk + AHEAD + l, _MM_HINT_T0);
                    _tile_loadd(4, xp + k, K * 2);
                    _tile_loadd(5, bk, ldb); _tile_dpbf16ps(0, 4, 5);
                    if (nb > 16) { _tile_loadd(6, bk + 32, ldb); _tile_dpbf16ps(1, 4, 6); }
                    if (nb > 32) { _tile_loadd(7, bk + 64, ldb); _tile_dpbf16ps(2, 4, 7); }
                    if (nb > 48) { _tile_loadd(5, bk + 96, ldb); _tile_dpbf16ps(3, 4, 5); }
                }
                _tile_stored(0, c, NB * 4);
                if (nb > 16) _tile_stored(1, c + 16, NB * 4);
                if (nb > 32) _tile_stored(2, c + 32, NB * 4);
                if (nb > 48) _tile_stored(3, c + 48, NB * 4);
                store_rows(OUT_AT(out, n0, f32), N, c, M, min64(nb, N - n0), bias ? bias + n0 : 0, 0, f32);
                continue;
            }
            for (int64_t m0 = 0; m0 < Mp; m0 += 32) {
                const uint16_t *a0 = xp + m0 * K, *a1 = a0 + 16 * K;
                for (int64_t j = 0; j < nb; j += 32) {
                    int two = nb - j > 16;
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    for (int64_t k = 0; k < K; k += 32) {
                        const uint16_t *bk = blk + k * nb + 2 * j;
                        /* the first 32 rows stream these columns' 16 x 128 bytes: ask AHEAD bytes on */
                        if (AHEAD && m0 == 0) {
                            const char *ahead = (const char *)bk + AHEAD;
                            for (int r = 0; r < 16; r++) {
                                _mm_prefetch(ahead + r * ldb, _MM_HINT_T0);
                                if (two) _mm_prefetch(ahead + r * ldb + 64, _MM_HINT_T0);
                            }
                        }
                        _tile_loadd(4, a0 + k, K * 2); _tile_loadd(5, a1 + k, K * 2);
                        _tile_loadd(6, bk, ldb); _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(2, 5, 6);
                        if (two) { _tile_loadd(7, bk + 32, ldb); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(3, 5, 7); }
                    }
                    _tile_stored(0, c + j, NB * 4); _tile_stored(2, c + 16 * NB + j, NB * 4);
                    if (two) { _tile_stored(1, c + j + 16, NB * 4); _tile_stored(3, c + 16 * NB + j + 16, NB * 4); }
                }
                store_rows(OUT_AT(out, m0 * N + n0, f32), N, c, min64(32, M - m0), min64(nb, N - n0),
                           bias ? bias + n0 : 0, 0, f32);
            }
        }
        _tile_release();
    }
    if (xp != x) free(xp);
#endif
    return 0;
}

/* Int8 weights.  The same products over weights quantized to int8 with one float32 scale an output column
   (w ~ q * scale, as nanoserve.quant.quantize_int8 makes them), through the dot products only (either build).
   q8_pack writes the columns' scales (Np floats) and then the bfloat16 layout's blocks at one byte an element, so a
   product reads its weights from memory at half the bfloat16 layout's bytes.  A pass converts each pair of inputs'
   weights to bfloat16 as it reads them (exactly: every int8 is a bfloat16), sums x * q in float32 with vdpbf16ps in
   the bfloat16 passes' order, and multiplies by the column's scale once, at the store.  Past PASS_ROWS rows each
   block is converted once into a bfloat16 scratch block, which the bfloat16 passes then read: the same sums, so a
   row's bits depend neither on the other rows nor on the threads (the batch-invariant mode holds).  The conversion
   (five instructions for 32 weights) hides behind the memory at a few rows; past them it is paid on top of the
   bfloat16 product's arithmetic. */
int64_t q8_packed_size(int64_t N, int64_t K) { int64_t Np = (N + 15) / 16 * 16; return 4 * Np + Np * K; }

void q8_pack(const int8_t *q, const float *scale, uint8_t *p, int64_t N, int64_t K) {
    int64_t Np = (N + 15) / 16 * 16;
    float *s = (float *)p;
    for (int64_t n = 0; n < Np; n++) s[n] = n < N ? scale[n] : 0.0f;
    pack_blocks((const char *)q, (char *)(p + 4 * Np), N, K, 1);
}

/* y = x @ (q * scale).T (+ b) in bfloat16 over q8_pack's layout, any number of rows: dot_linear's passes over int8
   blocks; float32 out with f32.  1 when out of memory, 2 when K is not a multiple of 32. */
TGT int q8_linear(const uint16_t *x, const void *packed, const uint16_t *bias, void *out, int64_t M, int64_t N,
                  int64_t K, int nthreads, int f32) {
    if (K % 32) return 2;
    int64_t Np = (N + 15) / 16 * 16;
    return dot_products(x, (const char *)packed + 4 * Np, (const float *)packed, bias, out, M, N, K, nthreads, 1,
                        f32);
}

/* Int4 weights in groups.  Codes q in 0..15 with a scale s and a zero z per group of g inputs and column
   (w = (q - 8) * s + z, as nanoserve.quant.quantize_int4 makes them), through the dot products.  A code is read as
   the bfloat16 128 + q, which is its bits 0x4300 | q: two integer instructions widen 32 codes (a mask-and-or, and a
   shift first for the high nibbles), against five for an int8.  So a group's sum over 128 + q is corrected once:
       sum_k x_k w_k = s * sum_k x_k (128 + q_k) - (136 s - z) * sum_k x_k,
   with each row's sum of x over the group computed once a product.  Each product of x and 128 + q is exact in
   float32; the sums are larger than the result, and lose about 2^-24 of them, far below the bfloat16 result's
   rounding.  q4_pack lays a block of 32 columns out group by group: the group's 32 scales and 32 corrections
   136 s - z (float32), then its g / 2 pairs of inputs, 32 bytes each: byte i holds, in its low nibble, word i of the
   first 16 columns' vector (column i / 2, input i % 2) and, in its high nibble, the same word of the next 16
   columns'.  A 64-byte head holds g.  A row's sums depend only on that row (the batch-invariant mode holds). */
#define Q4_NB 32                            /* columns of a block, whatever the build's NB */
#define Q4_ROWS 12                          /* rows of a pass: 12 x 2 accumulators */
static inline int64_t q4_block_bytes(int64_t K, int64_t g) { return K / g * (2 * Q4_NB * 4 + g / 2 * Q4_NB); }

int64_t q4_packed_size(int64_t N, int64_t K, int64_t g) { return 64 + (N + Q4_NB - 1) / Q4_NB * q4_block_bytes(K, g); }

/* q [N][K] codes (uint8, 0..15), s and z [N][K / g] float32; K a multiple of g, g of 16 */
void q4_pack(const uint8_t *q, const float *s, const float *z, uint8_t *p, int64_t N, int64_t K, int64_t g) {
    int64_t nblocks = (N + Q4_NB - 1) / Q4_NB, G = K / g, bb = q4_block_bytes(K, g);
    memset(p, 0, 64);
    memcpy(p, &g, 8);
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++)
        for (int64_t gi = 0; gi < G; gi++) {
            uint8_t *at = p + 64 + b * bb + gi * (2 * Q4_NB * 4 + g / 2 * Q4_NB);
            float *sc = (float *)at, *corr = sc + Q4_NB;
            for (int64_t j = 0; j < Q4_NB; j++) {
                int64_t n = b * Q4_NB + j;
                sc[j] = n < N ? s[n * G + gi] : 0.0f;
                corr[j] = n < N ? 136.0f * s[n * G + gi] - z[n * G + gi] : 0.0f;
            }
            uint8_t *codes = at + 2 * Q4_NB * 4;
            for (int64_t kp = 0; kp < g / 2; kp++)
                for (int64_t i = 0; i < 32; i++) {
                    int64_t k = gi * g + 2 * kp + i % 2, lo = b * Q4_NB + i / 2, hi = lo + 16;
                    uint8_t a = lo < N ? q[lo * K + k] & 15 : 0, c = hi < N ? q[hi * K + k] & 15 : 0;
                    codes[kp * 32 + i] = (uint8_t)(a | c << 4);
                }
        }
}

/* mr rows (pairs of x transposed, ldx words apart; xs: each row's sum over each group, [G][ldx]) against one block */
TGT static inline __attribute__((always_inline)) void q4_pass(const int32_t *xt, int64_t ldx, const float *xs,
        int64_t K, int64_t g, const uint8_t *blk, void *out, int64_t ldo, int64_t ncols, const uint16_t *bias,
        const int mr, const int f32) {
    __m512 acc[Q4_ROWS][2];
    float c[Q4_ROWS * NB] __attribute__((aligned(64)));
    const __m512i low = _mm512_set1_epi16(15), one28 = _mm512_set1_epi16(0x4300);
    for (int r = 0; r < mr; r++) for (int j = 0; j < 2; j++) _mm512_store_ps(c + r * NB + 16 * j, _mm512_setzero_ps());
    for (int64_t gi = 0; gi < K / g; gi++) {
        const uint8_t *at = blk + gi * (2 * Q4_NB * 4 + g / 2 * Q4_NB), *codes = at + 2 * Q4_NB * 4;
        const float *sc = (const float *)at, *corr = sc + Q4_NB;
        for (int r = 0; r < mr; r++) for (int j = 0; j < 2; j++) acc[r][j] = _mm512_setzero_ps();
        for (int64_t kp = 0; kp < g / 2; kp++) {
            __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(codes + kp * 32)));
            /* (v & 15) | 0x4300, and (v >> 4) | 0x4300: the bfloat16s 128 + q */
            __m512bh wa = (__m512bh)_mm512_ternarylogic_epi32(v, low, one28, 0xEA);
            __m512bh wb = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(v, 4), one28);
            const int32_t *a = xt + (gi * g / 2 + kp) * ldx;
            for (int r = 0; r < mr; r++) {
                __m512bh bx = (__m512bh)_mm512_set1_epi32(a[r]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], bx, wa);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], bx, wb);
            }
        }
        for (int j = 0; j < 2; j++) {
            __m512 sj = _mm512_loadu_ps(sc + 16 * j), cj = _mm512_loadu_ps(corr + 16 * j);
            for (int r = 0; r < mr; r++) {
                float *cr = c + r * NB + 16 * j;
                __m512 t = _mm512_fmadd_ps(sj, acc[r][j], _mm512_load_ps(cr));
                _mm512_store_ps(cr, _mm512_fnmadd_ps(cj, _mm512_set1_ps(xs[gi * ldx + r]), t));
            }
        }
    }
    store_rows(out, ldo, c, mr, ncols, bias, 0, f32);
}
#define Q4(n) case n: q4_pass(xt + q * Q4_ROWS * K2, ld, xs + q * Q4_ROWS * G, K, g, blk, \
                              OUT_AT(out, m * N + n0, f32), N, min64(Q4_NB, N - n0), bias ? bias + n0 : 0, n, f32); \
                      break;

/* y = x @ w.T (+ b) in bfloat16 over q4_pack's layout, any number of rows; x in panels of Q4_ROWS rows with their
   pairs transposed and each row's group sums beside them, the blocks split across threads.  1 when out of memory,
   2 when K is not a multiple of g (or g of 16); float32 out with f32. */
TGT int q4_linear(const uint16_t *x, const void *packed, const uint16_t *bias, void *out, int64_t M, int64_t N,
                  int64_t K, int nthreads, int f32) {
    int64_t g;
    memcpy(&g, packed, 8);
    if (g < 16 || g % 16 || K % g) return 2;
    int64_t nblocks = (N + Q4_NB - 1) / Q4_NB, K2 = K / 2, G = K / g, bb = q4_block_bytes(K, g);
    int64_t panels = (M + Q4_ROWS - 1) / Q4_ROWS, ld = M > 1 ? Q4_ROWS : 1;
    const uint8_t *p = (const uint8_t *)packed + 64;
    const int32_t *xd = (const int32_t *)x;
    int32_t *xt = M > 1 ? malloc(panels * Q4_ROWS * K2 * 4) : (int32_t *)xd;
    float *xs = malloc(panels * Q4_ROWS * G * 4);
    if (!xt || !xs) { if (M > 1) free(xt); free(xs); return 1; }
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int64_t q = panels * t / nt; q < panels * (t + 1) / nt; q++)
            for (int64_t m = q * Q4_ROWS; m < min64(M, (q + 1) * Q4_ROWS); m++) {
                if (M > 1)
                    for (int64_t k = 0; k < K2; k++) xt[q * Q4_ROWS * K2 + k * Q4_ROWS + m % Q4_ROWS] = xd[m * K2 + k];
                for (int64_t gi = 0; gi < G; gi++) {
                    __m512 sum = _mm512_setzero_ps();          /* 16 lanes of float32 sums, added up at the end */
                    for (int64_t k = gi * g; k < (gi + 1) * g; k += 16)
                        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                                  _mm256_loadu_si256((const __m256i *)(x + m * K + k))), 16)));
                    xs[q * Q4_ROWS * G + gi * ld + m % Q4_ROWS] = _mm512_reduce_add_ps(sum);
                }
            }
        _Pragma("omp barrier")
        for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
            int64_t n0 = b * Q4_NB;
            const uint8_t *blk = p + b * bb;
            for (int64_t q = 0; q < panels; q++) {
                int64_t m = q * Q4_ROWS;
                switch (min64(Q4_ROWS, M - m)) { Q4(1) Q4(2) Q4(3) Q4(4) Q4(5) Q4(6) Q4(7) Q4(8) Q4(9) Q4(10) Q4(11)
                                                  Q4(12) }
            }
        }
    }
    if (M > 1) free(xt);
    free(xs);
    return 0;
}

/* G products of one shape, one after another in one call (a mixture of experts' experts, each over its own rows):
   x[i] [M[i], K] @ w[i].T into out[i], bfloat16 and without a bias, through amx_linear (kind 0), q8_linear (1) or
   q4_linear (2), each computed as a call of its own computes it; the Python and ctypes of a call an expert is what
   this saves.  The first failing product's code, else 0. */
TGT int linear_many(int kind, int64_t G, const uint16_t *const *x, const void *const *w, void *const *out,
                    const int64_t *M, int64_t N, int64_t K, int nthreads) {
    for (int64_t i = 0; i < G; i++) {
        int failed = kind == 0 ? amx_linear(x[i], (const uint16_t *)w[i], 0, out[i], M[i], N, K, nthreads, 0)
                   : kind == 1 ? q8_linear(x[i], w[i], 0, out[i], M[i], N, K, nthreads, 0)
                   : q4_linear(x[i], w[i], 0, out[i], M[i], N, K, nthreads, 0);
        if (failed) return failed;
    }
    return 0;
}
