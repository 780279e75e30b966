/* Day 06's bfloat16 product kernel as the speed issue's thirteenth pass left it (nanoserve/fast.py at 4cb3a59), kept to time
   against: bench/bf16_dot.py builds it with -DNO_TILES (blocks of 64 columns, passes of at most 4 rows, a pointer a row of x). */
/* bfloat16 products y = x @ w.T (+ b) on Intel's AMX tiles, over weights packed once.  Compiled for AMX whatever the machine
   (target attributes); called only where the CPU has it and Linux has granted this process the tile state (amx_enable).
   Built with NO_TILES, for a CPU with avx512bf16 but no AMX (AMD's Zen 4 and 5, Intel's Cooper Lake): the same packed layout,
   every row count through the dot products, and no tile instruction in the library. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>
#include <omp.h>

#define NB 64                               /* output columns of a packed block: four 16-column tiles */
#ifndef AHEAD                              /* bytes of a block ahead of its tile loads that the first pass asks the memory for */
#define AHEAD 8192                          /* (0: none; bench/amx_prefetch.py builds the kernel so, to compare) */
#endif
#ifdef NO_TILES
#define DOT_ROWS (1 << 30)                  /* every product: there are no tiles */
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))
#endif
#ifndef DOT_ROWS                           /* products of at most this many rows (up to 4) take avx512bf16's dot products, not the tiles */
#define DOT_ROWS 1                          /* (0: the tiles at every row count, 4: up to 4 rows; bench/amx_dot.py builds both, to compare) */
#endif
#define DOT_AHEAD 4096                      /* bytes of a block ahead of the dot products' loads that they ask the memory for */
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int amx_enable(void) {                      /* ask Linux for the tile state: once per process is enough, again is harmless */
#ifdef NO_TILES
    return 0;                               /* nothing to ask for */
#else
    return (int)syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
#endif
}

/* w [N, K] -> blocks of 64 output columns (16 in the last, columns past N zeros), each [K/2][64][2]: a pair of inputs of
   every column side by side, the layout tdpbf16ps reads a weight tile in.  K must be a multiple of 32. */
int64_t amx_packed_size(int64_t N, int64_t K) { return (N + 15) / 16 * 16 * K; }

void amx_pack(const uint16_t *w, uint16_t *p, int64_t N, int64_t K) {
    int64_t Np = (N + 15) / 16 * 16;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < (Np + NB - 1) / NB; b++) {
        int64_t n0 = b * NB, nb = min64(NB, Np - n0);
        for (int64_t k = 0; k < K / 2; k++)
            for (int64_t j = 0; j < nb; j++)
                for (int64_t d = 0; d < 2; d++)
                    p[n0 * K + (k * nb + j) * 2 + d] = n0 + j < N ? w[(n0 + j) * K + 2 * k + d] : 0;
    }
}

typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg;

/* float32 results c [rows][64] -> bfloat16 out (+ bias), the first ncols columns, rounded to nearest even */
TGT static void store_rows(uint16_t *out, int64_t ldo, const float *c, int64_t rows, int64_t ncols, const uint16_t *bias) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < ncols; j += 16) {
            __mmask16 m = ncols - j >= 16 ? 0xffff : (__mmask16)((1u << (ncols - j)) - 1);
            __m512 v = _mm512_loadu_ps(c + r * NB + j);
            if (bias) v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, bias + j)), 16)));
            _mm256_mask_storeu_epi16(out + r * ldo + j, m, (__m256i)_mm512_cvtneps_pbh(v));
        }
}

int amx_dot_rows(void) { return DOT_ROWS; }

/* mr (1-4) rows of x against one block with vdpbf16ps, reading the same packed layout: for each pair of inputs, the block's nb
   columns x 2 (nb * 4 bytes, front to back) as nb / 16 vectors, against each row's pair broadcast.  Each output is one float32
   sum over the pairs in order (vdpbf16ps adds a pair's two products one after the other), so a row's bits do not depend on the
   other rows or the threads; they are not the tiles' bits, which round inside a tile in their own way. */
TGT static inline __attribute__((always_inline)) void dot_pass(const uint16_t *x, int64_t K, const uint16_t *blk, int64_t nb,
        uint16_t *out, int64_t ldo, int64_t ncols, const uint16_t *bias, const int mr) {
    __m512 acc[4][4];
    float c[4 * NB] __attribute__((aligned(64)));
    const int32_t *xd = (const int32_t *)x;             /* a pair of bfloat16 inputs as one 32-bit word */
    int nv = (int)(nb / 16);
    for (int r = 0; r < mr; r++) for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K / 2; k++) {
        const uint16_t *w = blk + k * nb * 2;
        if (nv == 4) {                                  /* a whole block: four vectors, one 256-byte run */
            for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)w + DOT_AHEAD + l, _MM_HINT_T0);
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(w), w1 = (__m512bh)_mm512_loadu_si512(w + 32),
                     w2 = (__m512bh)_mm512_loadu_si512(w + 64), w3 = (__m512bh)_mm512_loadu_si512(w + 96);
            for (int r = 0; r < mr; r++) {
                __m512bh a = (__m512bh)_mm512_set1_epi32(xd[r * (K / 2) + k]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0); acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
                acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, w2); acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, w3);
            }
        } else for (int j = 0; j < nv; j++) {          /* the last block, 16-48 columns */
            __m512bh wj = (__m512bh)_mm512_loadu_si512(w + 32 * j);
            for (int r = 0; r < mr; r++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)_mm512_set1_epi32(xd[r * (K / 2) + k]), wj);
        }
    }
    for (int r = 0; r < mr; r++) for (int j = 0; j < nv; j++) _mm512_store_ps(c + r * NB + 16 * j, acc[r][j]);
    store_rows(out, ldo, c, mr, ncols, bias);
}
#define DOT(n) case n: dot_pass(x + m * K, K, p + n0 * K, nb, out + m * N + n0, N, min64(nb, N - n0), bias ? bias + n0 : 0, n); break;

/* A product of one row reads each weight once whatever it does with it, and the dot products keep more of the memory's rate than
   the tiles (which load a 16-row tile of x that is all zeros but one row, and 16 weight rows 256 bytes apart).  The blocks are split
   across threads as the tiles split them; rows go in passes of up to 4, each over the block (the later ones find it in cache). */
TGT static void dot_linear(const uint16_t *x, const uint16_t *p, const uint16_t *bias, uint16_t *out, int64_t M, int64_t N, int64_t K, int nthreads) {
    int64_t Np = (N + 15) / 16 * 16, nblocks = (Np + NB - 1) / NB;
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
            int64_t n0 = b * NB, nb = min64(NB, Np - n0);
            for (int64_t m = 0; m < M; m += 4)
                switch (min64(4, M - m)) { DOT(1) DOT(2) DOT(3) DOT(4) }
        }
    }
}

/* Tiles: 0-3 results (float32, 16 x 16), 4-5 x (16 rows x 32 inputs), 5-7 weights (16 pairs of inputs x 16 columns).
   Up to 16 rows: one tile of x (its missing rows zeros) against the block's four weight tiles.  More: x in pairs of 16-row tiles
   against two weight tiles at a time, so each weight tile loaded from memory serves 32 rows.  The blocks are split across threads;
   each row's sums run in the same order whatever the number of rows (past DOT_ROWS) or threads.  Up to DOT_ROWS: dot_linear. */
TGT int amx_linear(const uint16_t *x, const uint16_t *p, const uint16_t *bias, uint16_t *out, int64_t M, int64_t N, int64_t K, int nthreads) {
    if (K % 32) return 2;
    if (M <= DOT_ROWS) { dot_linear(x, p, bias, out, M, N, K, nthreads); return 0; }
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
            int64_t n0 = b * NB, nb = min64(NB, Np - n0), ldb = nb * 4;     /* bytes from one pair of inputs to the next */
            const uint16_t *blk = p + n0 * K;
            if (Mp == 16) {
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                for (int64_t k = 0; k < K; k += 32) {
                    const uint16_t *bk = blk + k * nb;      /* 32 inputs of the block: nb * 64 bytes, front to back */
                    if (AHEAD) for (int64_t l = 0; l < nb * 64; l += 64) _mm_prefetch((const char *)bk + AHEAD + l, _MM_HINT_T0);
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
                store_rows(out + n0, N, c, M, min64(nb, N - n0), bias ? bias + n0 : 0);
                continue;
            }
            for (int64_t m0 = 0; m0 < Mp; m0 += 32) {
                const uint16_t *a0 = xp + m0 * K, *a1 = a0 + 16 * K;
                for (int64_t j = 0; j < nb; j += 32) {
                    int two = nb - j > 16;
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    for (int64_t k = 0; k < K; k += 32) {
                        const uint16_t *bk = blk + k * nb + 2 * j;
                        if (AHEAD && m0 == 0) {         /* the first 32 rows stream these columns' 16 x 128 bytes: ask AHEAD bytes on */
                            const char *ahead = (const char *)bk + AHEAD;
                            for (int r = 0; r < 16; r++) { _mm_prefetch(ahead + r * ldb, _MM_HINT_T0); if (two) _mm_prefetch(ahead + r * ldb + 64, _MM_HINT_T0); }
                        }
                        _tile_loadd(4, a0 + k, K * 2); _tile_loadd(5, a1 + k, K * 2);
                        _tile_loadd(6, bk, ldb); _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(2, 5, 6);
                        if (two) { _tile_loadd(7, bk + 32, ldb); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(3, 5, 7); }
                    }
                    _tile_stored(0, c + j, NB * 4); _tile_stored(2, c + 16 * NB + j, NB * 4);
                    if (two) { _tile_stored(1, c + j + 16, NB * 4); _tile_stored(3, c + 16 * NB + j + 16, NB * 4); }
                }
                store_rows(out + m0 * N + n0, N, c, min64(32, M - m0), min64(nb, N - n0), bias ? bias + n0 : 0);
            }
        }
        _tile_release();
    }
    if (xp != x) free(xp);
#endif
    return 0;
}
