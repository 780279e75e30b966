/* prefill_attention.c: causal prefill attention for one chunk of a sequence, read from the paged KV pool, bfloat16.

   Computes  softmax(q k^T * scale) v for the chunk's n queries (the last n of L tokens), each over the keys up to
             its own position, on AMX tiles or, built with NO_TILES, AVX512-BF16 dot products; and, on AMX only, the
             batch-invariant order that decode rows and prefill tokens share (an online softmax over steps of 32
             keys at fixed positions, its products on tiles).
   Entry     prefill_amx_enable (the tile state) and prefill_attention_bf16; tile_decode_bf16 and tile_tokens_bf16
             (the shared order: decode_attention_bf16's and token_attention_bf16's arguments); each returns 2 for a
             shape it does not take, 1 when out of memory.
   Build     PREFILL_KERNEL_FLAGS in nanoserve/prefill_kernel.py: -O3 -fopenmp -fPIC -shared -std=c11, as
             'prefill_attention' (AMX) or 'prefill_attention_dots' (-DNO_TILES), by PREFILL_BUILDS (prefill_kernel).
   Checked   nbs/11_prefill_kernel.ipynb, "Checks": the kernel against SDPA and float64 on chunk shapes, and "Checks: a
             token's bits are its decode's" (the shared order, bit for bit); tests/test_fast.py::
             test_prefill_kernel_greedy_text_equals_sdpa, tests/test_batch_invariance.py. */

/* Prefill attention on AMX tiles, bfloat16: one chunk's n queries (the last n tokens of a sequence of L, positions
   L-n .. L-1), each over the keys up to its own position, read from the paged pool through the sequence's slots.
   Per KV head, K and V are first copied out of the pool into the layouts tdpbf16ps reads (K as 16-key tiles of
   d-pairs, V as 32-key tiles of key-pairs). A work item is one query head and 16 queries: their scores, 16 keys a
   tile (float32), a softmax per query over its own keys (exp in float32, the weights rounded to bfloat16 for the
   second product, as PyTorch's CPU flash attention rounds them), and the weighted sum of V, 16 of D a tile.  A
   query's sums do not depend on the other rows of its tile: a query gets the same bits in any chunk, block or
   thread. Built with NO_TILES, for a CPU with avx512bf16 but no AMX: the same layouts and softmax, the two products
   as vdpbf16ps dot products instead (a tile's row of pairs is one 512-bit register), up to 4 queries against 4
   vectors at a time. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>
#include <omp.h>
#ifdef NO_TILES
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))
#endif
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg;
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int prefill_amx_enable(void) {
#ifdef NO_TILES
    return 0;                                                  /* nothing to ask for */
#else
    return (int)syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
#endif
}

#ifdef NO_TILES
/* acc[a][c] += x[a] . w[c] over np pairs: x rows (mr <= 4) of 32-bit pairs, xs apart, element e of row a at x[a * xs
   + e]; w: nw (<= 4) runs of 16-lane vectors of pairs, run c's vector e at w + c * ws + e * 16 (32-bit words).  Each
   lane a float32 sum over the pairs in order, whatever mr and nw, so a query's bits do not depend on the other
   queries. */
TGT static inline __attribute__((always_inline)) void dots(__m512 acc[4][4], const int32_t *x, int64_t xs, int mr,
        const uint32_t *w, int64_t ws, int nw, int64_t np, int64_t e0, int64_t wstep) {
    for (int64_t e = 0; e < np; e++) {
        __m512bh wv[4];
        for (int c = 0; c < nw; c++) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * ws + e * wstep);
        for (int a = 0; a < mr; a++) {
            __m512bh xa = (__m512bh)_mm512_set1_epi32(x[a * xs + e0 + e]);
            for (int c = 0; c < nw; c++) acc[a][c] = _mm512_dpbf16_ps(acc[a][c], xa, wv[c]);
        }
    }
}
#endif

/* exp of 16 lanes (x <= 0), float32: 2^(x log2 e) split as 2^i * 2^f, 2^f by a degree-6 polynomial; relative error
   ~2e-7 */
TGT static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 i = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(t, i);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, i);
}

TGT int prefill_attention_bf16(const uint16_t *q, int64_t ldq, const uint16_t *k, const uint16_t *v,
                               const int64_t *slots, int64_t L, int64_t n, uint16_t *out, int64_t ldo, int64_t H,
                               int64_t KVH, int64_t D, float scale, int nthreads) {
    if (D % 32 || H % KVH || n > L || n < 1) return 2;
    int64_t G = H / KVH, L16 = (L + 15) / 16 * 16, L32 = (L + 31) / 32 * 32, nq = (n + 15) / 16, KD = KVH * D;
    /* kt[h][key tile][d tile]: 16 rows (d-pairs) x 16 keys x 2; vt[h][key-pair tile][d tile]: 16 rows (key pairs) x
       16 d x 2 */
    if (nthreads < 1) nthreads = 1;
    /* each thread's scratch: scores, a tile of output, weights, queries */
    int64_t per = 16 * L16 * 4 + 16 * 64 * 4 + 16 * L32 * 2 + 16 * D * 2;
    uint32_t *kt = aligned_alloc(64, (size_t)KVH * L16 * D * 2), *vt = aligned_alloc(64, (size_t)KVH * L32 * D * 2);
    /* allocated before the threads, so every thread reaches each loop */
    char *scratch = aligned_alloc(64, (size_t)per * nthreads);
    if (!kt || !vt || !scratch) { free(kt); free(vt); free(scratch); return 1; }
    #pragma omp parallel num_threads(nthreads)
    {
        #pragma omp for schedule(static) collapse(2)
        for (int64_t h = 0; h < KVH; h++) for (int64_t kb = 0; kb < L32 / 16; kb++) {
            /* key kb*16+j: its d-pairs into column j of each d tile */
            for (int64_t j = 0; j < 16; j++) {
                int64_t t = kb * 16 + j;
                const uint32_t *kr = t < L ? (const uint32_t *)(k + slots[t] * KD + h * D) : 0;
                if (kb < L16 / 16)
                    for (int64_t r = 0; r < D / 2; r++)             /* d tile r/16, row r%16 */
                        kt[((h * (L16 / 16) + kb) * (D / 32) + r / 16) * 256 + (r % 16) * 16 + j] = kr ? kr[r] : 0;
            }
            for (int64_t j = 0; j < 16; j += 1) {                  /* key pairs: rows of the key-pair tile kb/2 */
                /* key t0 is half `t0 % 2` of pair row (t0 % 32) / 2 */
                int64_t t0 = kb * 16 + j;
                const uint16_t *vr = t0 < L ? v + slots[t0] * KD + h * D : 0;
                uint16_t *tile = (uint16_t *)(vt + (h * (L32 / 32) + t0 / 32) * (D / 16) * 256);
                int64_t row = (t0 % 32) / 2, half = t0 % 2;
                for (int64_t d = 0; d < D; d++) tile[(d / 16) * 512 + row * 32 + (d % 16) * 2 + half] = vr ? vr[d] : 0;
            }
        }
#ifndef NO_TILES
        tilecfg cfg = {0}; cfg.palette = 1;
        for (int i = 0; i < 8; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
        _tile_loadconfig(&cfg);
#endif
        float *s = (float *)(scratch + per * omp_get_thread_num()), *o = s + 16 * L16;
        uint16_t *p = (uint16_t *)(o + 16 * 64), *qp = p + 16 * L32;
        {
            #pragma omp for schedule(dynamic, 1) collapse(2)
            for (int64_t hq = 0; hq < H; hq++) for (int64_t b = 0; b < nq; b++) {
                /* keys the block sees */
                int64_t h = hq / G, i0 = b * 16, rows = min64(16, n - i0), kend = L - n + i0 + rows;
                for (int64_t r = 0; r < 16; r++)
                    if (r < rows) memcpy(qp + r * D, q + (i0 + r) * ldq + hq * D, D * 2);
                    else memset(qp + r * D, 0, D * 2);
                const uint32_t *kh = kt + h * (L16 / 16) * (D / 32) * 256;
#ifdef NO_TILES
                /* scores: 4 queries x 4 key blocks of 16 at a time */
                for (int64_t r0 = 0; r0 < rows; r0 += 4)
                    for (int64_t kb = 0; kb < (kend + 15) / 16; kb += 4) {
                        int mr = (int)min64(4, rows - r0), nk = (int)min64(4, (kend + 15) / 16 - kb);
                        __m512 acc[4][4];
                        for (int a = 0; a < 4; a++) for (int c = 0; c < 4; c++) acc[a][c] = _mm512_setzero_ps();
                        /* d-pairs dt*16 .. dt*16+15: the rows of d tile dt */
                        for (int64_t dt = 0; dt < D / 32; dt++)
                            dots(acc, (const int32_t *)qp + r0 * (D / 2), D / 2, mr, kh + (kb * (D / 32) + dt) * 256,
                                 (D / 32) * 256, nk, 16, dt * 16, 16);
                        for (int a = 0; a < mr; a++)
                            for (int c = 0; c < nk; c++)
                                _mm512_storeu_ps(s + (r0 + a) * L16 + (kb + c) * 16, acc[a][c]);
                    }
#else
                for (int64_t kb = 0; kb < (kend + 15) / 16; kb++) {    /* scores: 16 queries x 16 keys a tile */
                    _tile_zero(0);
                    for (int64_t dt = 0; dt < D / 32; dt++) {
                        _tile_loadd(4, qp + dt * 32, D * 2);
                        _tile_loadd(6, kh + (kb * (D / 32) + dt) * 256, 64);
                        _tile_dpbf16ps(0, 4, 6);
                    }
                    _tile_stored(0, s + kb * 16, L16 * 4);
                }
#endif
                int64_t k32 = (kend + 31) / 32 * 32;
                float inv[16];
                for (int64_t r = 0; r < 16; r++) {                     /* softmax over the query's own keys */
                    float *sr = s + r * L16; uint16_t *pr = p + r * L32;
                    int64_t cnt = r < rows ? L - n + i0 + r + 1 : 0;
                    if (!cnt) { memset(pr, 0, k32 * 2); inv[r] = 0.f; continue; }
                    __m512 mx = _mm512_set1_ps(-INFINITY);
                    for (int64_t j = 0; j < cnt; j += 16) {
                        __mmask16 m = cnt - j >= 16 ? 0xffff : (__mmask16)((1u << (cnt - j)) - 1);
                        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_loadu_ps(sr + j));
                    }
                    float mv = _mm512_reduce_max_ps(mx) * scale;
                    __m512 sum = _mm512_setzero_ps(), sc = _mm512_set1_ps(scale), mvv = _mm512_set1_ps(mv);
                    for (int64_t j = 0; j < k32; j += 16) {
                        __mmask16 m = cnt - j >= 16 ? 0xffff : cnt > j ? (__mmask16)((1u << (cnt - j)) - 1) : 0;
                        __m512 x = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, sr + j), sc, mvv);
                        __m512 e = _mm512_maskz_mov_ps(m, exp16(x));
                        sum = _mm512_add_ps(sum, e);
                        _mm256_storeu_si256((__m256i *)(pr + j), (__m256i)_mm512_cvtneps_pbh(e));
                    }
                    inv[r] = 1.f / _mm512_reduce_add_ps(sum);
                }
                const uint32_t *vh = vt + h * (L32 / 32) * (D / 16) * 256;
#ifdef NO_TILES
                /* the weighted sum of V: 4 queries x 4 vectors of 16 of D at a time */
                for (int64_t r0 = 0; r0 < rows; r0 += 4)
                    for (int64_t d0 = 0; d0 < D / 16; d0 += 4) {
                        int mr = (int)min64(4, rows - r0), nd = (int)min64(4, D / 16 - d0);
                        __m512 acc[4][4];
                        for (int a = 0; a < 4; a++) for (int c = 0; c < 4; c++) acc[a][c] = _mm512_setzero_ps();
                        /* key pairs kp*16 .. kp*16+15: the rows of V's tiles kp */
                        for (int64_t kp = 0; kp < k32 / 32; kp++)
                            dots(acc, (const int32_t *)p + r0 * (L32 / 2), L32 / 2, mr, vh + (kp * (D / 16) + d0) * 256,
                                 256, nd, 16, kp * 16, 16);
                        for (int a = 0; a < mr; a++)
                            for (int c = 0; c < nd; c++)
                                _mm256_storeu_si256((__m256i *)(out + (i0 + r0 + a) * ldo + hq * D + (d0 + c) * 16),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[a][c], _mm512_set1_ps(inv[r0 + a]))));
                    }
#else
                /* the weighted sum of V: up to 4 tiles of 16 of D */
                for (int64_t d0 = 0; d0 < D / 16; d0 += 4) {
                    int64_t nd = min64(4, D / 16 - d0);
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    for (int64_t kp = 0; kp < k32 / 32; kp++) {
                        _tile_loadd(4, p + kp * 32, L32 * 2);
                        const uint32_t *vk = vh + kp * (D / 16) * 256;
                        _tile_loadd(6, vk + (d0 + 0) * 256, 64); _tile_dpbf16ps(0, 4, 6);
                        if (nd > 1) { _tile_loadd(7, vk + (d0 + 1) * 256, 64); _tile_dpbf16ps(1, 4, 7); }
                        if (nd > 2) { _tile_loadd(6, vk + (d0 + 2) * 256, 64); _tile_dpbf16ps(2, 4, 6); }
                        if (nd > 3) { _tile_loadd(7, vk + (d0 + 3) * 256, 64); _tile_dpbf16ps(3, 4, 7); }
                    }
                    _tile_stored(0, o, 256);
                    if (nd > 1) _tile_stored(1, o + 16, 256);
                    if (nd > 2) _tile_stored(2, o + 32, 256);
                    if (nd > 3) _tile_stored(3, o + 48, 256);
                    for (int64_t r = 0; r < rows; r++)
                        for (int64_t c = 0; c < nd; c++)
                            _mm256_storeu_si256((__m256i *)(out + (i0 + r) * ldo + hq * D + (d0 + c) * 16),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(o + r * 64 + c * 16),
                                                                          _mm512_set1_ps(inv[r]))));
                }
#endif
            }
        }
#ifndef NO_TILES
        _tile_release();
#endif
    }
    free(kt); free(vt); free(scratch);
    return 0;
}

/* The batch-invariant order on tiles: one order of sums that a decode row and a prefill token share, so that a
   token's bits are those it would get as a decode whatever its batch or chunk, at the tiles' speed.

   A query's keys go in steps of 32 at fixed positions (32j .. 32j+31), an online softmax across the steps: at each,
   its 32 scores by tdpbf16ps (float32 sums of bfloat16 products over D, the tile's own order), a running max and a
   lanewise running sum, the weights exp(x - max) rounded to bfloat16 and their sum with V by tdpbf16ps into a fresh
   tile, added to the float32 output after its earlier part is rescaled. What a query computes depends only on its
   own queries, keys and values: a tile's element is the same whichever rows and columns share the tile, and which
   operand holds the keys (a decode puts the keys in A's rows and its few query heads in B's columns, a prefill 16
   queries in A's rows and the keys in B's columns: the same products summed in the same order; checked bit for bit
   in nbs/11_prefill_kernel.ipynb). The scaling, softmax steps and the last division are single functions, never
   inlined, so every caller runs the same instructions.

   Keys a query does not see within its last step weigh exactly 0: a decode zeroes their V rows (the pool past its
   context holds anything), a prefill multiplies later tokens' finite V by 0; the two sums differ only if a sum
   of V's products were exactly -0, which takes every seen value to be -0.

   Built with NO_TILES (AVX512-BF16, no AMX), the same steps and the same softmax, with vdpbf16ps dot products in
   place of the tiles: a score is one float32 sum over K's d-pairs in order, 16 keys to a vector (K's pairs laid
   down the rows as for the tiles: a decode lays its own step out so too), and a weighted sum one over the key pairs
   in order, 16 of D to a vector. Its bits are the build's own, not the tiles'; a decode and a prefill share them. */
#define KT 32                                   /* keys in a step of the online softmax */
#define MAXD 256

/* A step over keys 32j.. for up to 16 queries, row c seeing the first sees[c] of them (1..32; none: the row is left
   as it was and its weights are zero): its 32 scores s[c] (float32, as the products wrote them) scaled and masked,
   its running max m[c] and lanewise sum lv[c] brought up to date, its weights exp(x - max) rounded to bfloat16 into
   p[c]; alpha[c], the factor its earlier sums take. Every row's arithmetic is its own (the factors are one vector's
   lanes), so a row's bits do not depend on the others. */
TGT __attribute__((noinline)) static void online_step(const float *s, const int64_t *sees, int64_t nr, float scale,
                                                      float *m, float *lv, uint16_t *p, float *alpha) {
    __m512 ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale), x[16][2];
    float before[16], now[16];
    __mmask16 mk[16][2];
    for (int64_t c = 0; c < 16; c++) {
        before[c] = now[c] = 0.f;
        if (c >= nr || sees[c] <= 0) continue;
        int64_t valid = sees[c];
        __mmask16 m0 = valid >= 16 ? 0xffff : (__mmask16)((1u << valid) - 1);
        __mmask16 m1 = valid >= 32 ? 0xffff : valid > 16 ? (__mmask16)((1u << (valid - 16)) - 1) : 0;
        x[c][0] = _mm512_mask_mul_ps(ninf, m0, _mm512_loadu_ps(s + c * KT), sc);
        x[c][1] = _mm512_mask_mul_ps(ninf, m1, _mm512_loadu_ps(s + c * KT + 16), sc);
        mk[c][0] = m0;
        mk[c][1] = m1;
        float top = _mm512_reduce_max_ps(_mm512_max_ps(x[c][0], x[c][1]));
        before[c] = m[c];
        now[c] = m[c] = top > m[c] ? top : m[c];
    }
    /* the factors, all rows at once; a first step's earlier max is -inf: exp16 clamps, and the factor multiplies
       zeros */
    _mm512_storeu_ps(alpha, exp16(_mm512_sub_ps(_mm512_loadu_ps(before), _mm512_loadu_ps(now))));
    for (int64_t c = 0; c < 16; c++) {
        if (c >= nr || sees[c] <= 0) { memset(p + c * KT, 0, KT * 2); continue; }
        __m512 mv = _mm512_set1_ps(now[c]);
        __m512 e0 = exp16(_mm512_sub_ps(x[c][0], mv)), e1 = exp16(_mm512_sub_ps(x[c][1], mv));
        e0 = _mm512_maskz_mov_ps(mk[c][0], e0);
        e1 = _mm512_maskz_mov_ps(mk[c][1], e1);
        _mm512_storeu_ps(lv + c * 16, _mm512_fmadd_ps(_mm512_loadu_ps(lv + c * 16), _mm512_set1_ps(alpha[c]),
                                                      _mm512_add_ps(e0, e1)));
        _mm512_storeu_si512(p + c * KT, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
}

/* acc[c] = acc[c] * alpha[c] + o[c], D floats, for the rows that saw keys of the step */
TGT __attribute__((noinline)) static void acc_step(float *acc, const float *o, const float *alpha, const int64_t *sees,
                                                   int64_t nr, int64_t D) {
    for (int64_t c = 0; c < nr; c++) {
        if (sees[c] <= 0) continue;
        __m512 a = _mm512_set1_ps(alpha[c]);
        for (int64_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(acc + c * D + d, _mm512_fmadd_ps(_mm512_loadu_ps(acc + c * D + d), a,
                                                              _mm512_loadu_ps(o + c * D + d)));
    }
}

/* a query's output: acc over the sum of its weights, rounded to bfloat16 */
TGT __attribute__((noinline)) static void finish_row(const float *acc, const float *lv, int64_t D, uint16_t *out) {
    __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(_mm512_loadu_ps(lv)));
    for (int64_t d = 0; d < D; d += 16)
        _mm256_storeu_si256((__m256i *)(out + d),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(acc + d), inv)));
}

/* A step's V as tdpbf16ps's B operand, D/16 tiles of [16 key pairs][16 d x 2]: row r of tile i holds d 16i..16i+15
   of keys 2r and 2r+1, interleaved; keys from `valid` on are zero. rows[t]: key t's V row. */
TGT static void v_pairs(const uint16_t *const *rows, int64_t valid, int64_t D, uint16_t *vp) {
    __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                  39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t r = 0; r < 16; r++)
        for (int64_t d = 0; d < D; d += 32) {
            __m512i a = 2 * r < valid ? _mm512_loadu_si512(rows[2 * r] + d) : _mm512_setzero_si512();
            __m512i b = 2 * r + 1 < valid ? _mm512_loadu_si512(rows[2 * r + 1] + d) : _mm512_setzero_si512();
            _mm512_storeu_si512(vp + ((d / 16) * 16 + r) * 32, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(vp + ((d / 16 + 1) * 16 + r) * 32, _mm512_permutex2var_epi16(a, hi, b));
        }
}

/* The weighted sum of a step's V: A the weights p [16 rows][32 keys], B vp (v_pairs), into o [16 rows][D] float32
   (row stride D), a fresh tile per 16 of D. */
#ifdef NO_TILES
/* scores of nq queries (rows of D bfloat16, ldq apart) against a step's 32 keys laid out as kt (K's d-pairs down the
   rows, keys 0-15 then 16-31): s [nq][32], each one float32 sum over the pairs in order; 4 queries at a time */
TGT static void step_scores(const uint16_t *q, int64_t ldq, int64_t nq, const uint32_t *kt, int64_t D, float *s) {
    for (int64_t c0 = 0; c0 < nq; c0 += 4) {
        int mr = (int)min64(4, nq - c0);
        __m512 acc[4][2];
        for (int a = 0; a < 4; a++) acc[a][0] = acc[a][1] = _mm512_setzero_ps();
        for (int64_t i = 0; i < D / 2; i++) {
            __m512bh k0 = (__m512bh)_mm512_loadu_si512(kt + (i / 16) * 256 + (i % 16) * 16);
            __m512bh k1 = (__m512bh)_mm512_loadu_si512(kt + (D / 32 + i / 16) * 256 + (i % 16) * 16);
            for (int a = 0; a < mr; a++) {
                __m512bh qa = (__m512bh)_mm512_set1_epi32(((const int32_t *)(q + (c0 + a) * ldq))[i]);
                acc[a][0] = _mm512_dpbf16_ps(acc[a][0], qa, k0);
                acc[a][1] = _mm512_dpbf16_ps(acc[a][1], qa, k1);
            }
        }
        for (int a = 0; a < mr; a++) {
            _mm512_storeu_ps(s + (c0 + a) * KT, acc[a][0]);
            _mm512_storeu_ps(s + (c0 + a) * KT + 16, acc[a][1]);
        }
    }
}

/* the weighted sum of a step's V for nq rows of weights p [16][32]: o [nq][D], each one float32 sum over the key
   pairs in order */
TGT static void weighted_v(const uint16_t *p, const uint16_t *vp, int64_t D, float *o, int64_t nq) {
    for (int64_t c = 0; c < nq; c++)
        for (int64_t i = 0; i < D / 16; i += 4) {
            int nd = (int)min64(4, D / 16 - i);
            __m512 acc[4];
            for (int a = 0; a < 4; a++) acc[a] = _mm512_setzero_ps();
            for (int64_t r = 0; r < 16; r++) {
                __m512bh pr = (__m512bh)_mm512_set1_epi32(((const int32_t *)(p + c * KT))[r]);
                for (int a = 0; a < nd; a++)
                    acc[a] = _mm512_dpbf16_ps(acc[a], pr, (__m512bh)_mm512_loadu_si512(vp + (i + a) * 512 + r * 32));
            }
            for (int a = 0; a < nd; a++) _mm512_storeu_ps(o + c * D + (i + a) * 16, acc[a]);
        }
}
TGT static void tiles_on(void) {}
#define TILES_OFF()
#else
#define TILES_OFF() _tile_release()
TGT static void weighted_v(const uint16_t *p, const uint16_t *vp, int64_t D, float *o, int64_t nq) {
    (void)nq;                                  /* a tile takes all 16 rows */
    _tile_loadd(4, p, 64);
    for (int64_t i = 0; i < D / 16; i += 4) {
        int64_t nd = min64(4, D / 16 - i);
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        _tile_loadd(5, vp + (i + 0) * 512, 64); _tile_dpbf16ps(0, 4, 5);
        if (nd > 1) { _tile_loadd(6, vp + (i + 1) * 512, 64); _tile_dpbf16ps(1, 4, 6); }
        if (nd > 2) { _tile_loadd(5, vp + (i + 2) * 512, 64); _tile_dpbf16ps(2, 4, 5); }
        if (nd > 3) { _tile_loadd(6, vp + (i + 3) * 512, 64); _tile_dpbf16ps(3, 4, 6); }
        _tile_stored(0, o + (i + 0) * 16, D * 4);
        if (nd > 1) _tile_stored(1, o + (i + 1) * 16, D * 4);
        if (nd > 2) _tile_stored(2, o + (i + 2) * 16, D * 4);
        if (nd > 3) _tile_stored(3, o + (i + 3) * 16, D * 4);
    }
}

TGT static void tiles_on(void) {
    tilecfg cfg = {0};
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
}
#endif

/* keys 0..valid-1 of a step (rows[t]: key t's K row) laid out as the scores' B operand: D / 32 tiles of [16 d-pairs]
   [16 keys] for keys 0-15, then as many for 16-31; missing keys zero */
TGT static void k_pairs(const uint16_t *const *rows, int64_t valid, int64_t D, uint32_t *kt) {
    int64_t whole = valid / 16 * 16;                /* whole halves: 16 x 16 transposes of 32-bit d-pairs */
    for (int64_t h = 0; h < whole / 16; h++)
        for (int64_t i = 0; i < D / 32; i++) {
            __m512i r[16], t[16], q[4][4];
            for (int u = 0; u < 16; u++) r[u] = _mm512_loadu_si512(rows[h * 16 + u] + i * 32);
            for (int u = 0; u < 16; u += 2) {       /* rows u, u+1: per 128-bit lane [a0 b0 a1 b1], [a2 b2 a3 b3] */
                t[u] = _mm512_unpacklo_epi32(r[u], r[u + 1]);
                t[u + 1] = _mm512_unpackhi_epi32(r[u], r[u + 1]);
            }
            for (int g = 0; g < 4; g++) {           /* rows 4g..4g+3: q[g][j], lane l holds their word 4l + j */
                q[g][0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
                q[g][1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
                q[g][2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
                q[g][3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
            }
            for (int j = 0; j < 4; j++) {           /* lane l of the four groups: word 4l + j of all 16 rows */
                __m512i x0 = _mm512_shuffle_i32x4(q[0][j], q[1][j], 0x44);
                __m512i x1 = _mm512_shuffle_i32x4(q[0][j], q[1][j], 0xee);
                __m512i y0 = _mm512_shuffle_i32x4(q[2][j], q[3][j], 0x44);
                __m512i y1 = _mm512_shuffle_i32x4(q[2][j], q[3][j], 0xee);
                r[j] = _mm512_shuffle_i32x4(x0, y0, 0x88);
                r[4 + j] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
                r[8 + j] = _mm512_shuffle_i32x4(x1, y1, 0x88);
                r[12 + j] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
            }
            for (int u = 0; u < 16; u++) _mm512_storeu_si512(kt + ((h * (D / 32) + i) * 16 + u) * 16, r[u]);
        }
    memset(kt + whole / 16 * (D / 32) * 256, 0, (KT - whole) * D * 2);
    for (int64_t u = whole; u < valid; u++) {
        const uint32_t *kr = (const uint32_t *)rows[u];
        for (int64_t i = 0; i < D / 2; i++)         /* key u, d-pair i */
            kt[((u / 16) * (D / 32) + i / 16) * 256 + (i % 16) * 16 + u % 16] = kr[i];
    }
}

/* A thread's scratch for a decode unit: Q as B pairs, a step's K rows and V pairs, scores both ways, weights, the
   tile's output, and each query's state (max, lanewise sum, output) */
typedef struct { uint32_t *qt; uint16_t *kb, *vp, *p; float *s1, *s, *o, *m, *lv, *acc; } unit_scratch;
static int64_t unit_floats(int64_t D) {
    return D * 8 + KT * D / 2 + KT * D / 2 + 16 * KT / 2 + 16 * KT + 16 * KT + 16 * D + 16 + 16 * 16 + 16 * D;
}
static unit_scratch unit_carve(float *f, int64_t D) {
    unit_scratch w;
    w.qt = (uint32_t *)f; f += D * 8;
    w.kb = (uint16_t *)f; f += KT * D / 2;
    w.vp = (uint16_t *)f; f += KT * D / 2;
    w.p = (uint16_t *)f; f += 16 * KT / 2;
    w.s1 = f; f += 16 * KT;
    w.s = f; f += 16 * KT;
    w.o = f; f += 16 * D;
    w.m = f; f += 16;
    w.lv = f; f += 16 * 16;
    w.acc = f;
    return w;
}

/* One decode row's query heads g0 .. g0+nc-1 (nc <= 16, of KV head h) over its n keys (slots; the last one new_k's
   and new_v's where those are given). The keys go into A's rows straight from a copy of their K rows, the heads
   into B's columns, so a step's K is read once for all the heads. */
TGT static void decode_unit(const uint16_t *q, const uint16_t *k, const uint16_t *v, const int64_t *slots, int64_t n,
                            const uint16_t *new_k, const uint16_t *new_v, uint16_t *out, int64_t h, int64_t g0,
                            int64_t nc, int64_t KVH, int64_t D, float scale, unit_scratch w) {
    int64_t KD = KVH * D;
    memset(w.qt, 0, D * 32);
    memset(w.p, 0, 16 * KT * 2);
    for (int64_t c = 0; c < nc; c++) {
#ifndef NO_TILES
        const uint32_t *qc = (const uint32_t *)(q + (g0 + c) * D);
        for (int64_t i = 0; i < D / 2; i++) w.qt[i * 16 + c] = qc[i];       /* d-pair i: row i % 16 of tile i / 16 */
#endif
        w.m[c] = -INFINITY;
        memset(w.lv + c * 16, 0, 64);
        memset(w.acc + c * D, 0, D * 4);
    }
    const uint16_t *krow[KT], *vrow[KT];
    for (int64_t j = 0; j * KT < n; j++) {
        int64_t valid = min64(KT, n - j * KT);
        for (int64_t t = 0; t < valid; t++) {
            int64_t key = j * KT + t;
            int own = new_k && key == n - 1;
            krow[t] = own ? new_k + h * D : k + slots[key] * KD + h * D;
            vrow[t] = own ? new_v + h * D : v + slots[key] * KD + h * D;
        }
        float alpha[16];
        int64_t sees[16];
        for (int64_t c = 0; c < 16; c++) sees[c] = c < nc ? valid : 0;
#ifdef NO_TILES
        k_pairs(krow, valid, D, (uint32_t *)w.kb);
        step_scores(q + g0 * D, D, nc, (const uint32_t *)w.kb, D, w.s);
#else
        for (int64_t t = 0; t < KT; t++)
            if (t < valid) memcpy(w.kb + t * D, krow[t], D * 2);
            else memset(w.kb + t * D, 0, D * 2);
        _tile_zero(0); _tile_zero(1);
        for (int64_t dt = 0; dt < D / 32; dt++) {
            _tile_loadd(4, w.kb + dt * 32, D * 2);
            _tile_loadd(5, w.kb + 16 * D + dt * 32, D * 2);
            _tile_loadd(6, w.qt + dt * 256, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
        }
        _tile_stored(0, w.s1, 64);
        _tile_stored(1, w.s1 + 256, 64);
        for (int64_t c = 0; c < nc; c++)
            for (int64_t t = 0; t < KT; t++) w.s[c * KT + t] = w.s1[t * 16 + c];
#endif
        online_step(w.s, sees, nc, scale, w.m, w.lv, w.p, alpha);
        v_pairs(vrow, valid, D, w.vp);
        weighted_v(w.p, w.vp, D, w.o, nc);
        acc_step(w.acc, w.o, alpha, sees, nc, D);
    }
    for (int64_t c = 0; c < nc; c++) finish_row(w.acc + c * D, w.lv + c * 16, D, out + (g0 + c) * D);
}

/* A decode step's R rows in the tiles' order (decode_attention_bf16's arguments): units of (row, KV head, a run of
   its query heads), split across the threads; a KV head's heads in runs of at most 16, shorter where the units would
   be fewer than the threads. Returns 2 for a shape it does not take, 1 when out of memory. */
TGT int tile_decode_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, const int64_t *win, int64_t W,
                         const int64_t *ctx, const uint16_t *new_k, const uint16_t *new_v, uint16_t *out, int64_t R,
                         int64_t H, int64_t KVH, int64_t D, float scale, int nthreads) {
    if (D % 32 || D > MAXD || H % KVH || R < 1) return 2;
    if (nthreads < 1) nthreads = 1;
    int64_t G = H / KVH, parts = (G + 15) / 16;
    if (R * KVH * parts < nthreads) parts = min64(G, (nthreads + R * KVH - 1) / (R * KVH));
    int64_t size = (G + parts - 1) / parts, units = R * KVH * parts, per = unit_floats(D) + 16;
    float *scratch = aligned_alloc(64, (size_t)per * 4 * nthreads);
    if (!scratch) return 1;
    #pragma omp parallel num_threads(nthreads)
    {
        tiles_on();
        unit_scratch w = unit_carve(scratch + per * omp_get_thread_num(), D);
        #pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            int64_t r = u / (KVH * parts), h = u / parts % KVH, g0 = u % parts * size, nc = min64(size, G - g0);
            if (nc <= 0) continue;
            decode_unit(q + r * H * D, k, v, win + r * W, ctx[r], new_k ? new_k + r * KVH * D : 0,
                        new_v ? new_v + r * KVH * D : 0, out + r * H * D, h, h * G + g0, nc, KVH, D, scale, w);
        }
        TILES_OFF();
    }
    free(scratch);
    return 0;
}

/* A prefill chunk's R tokens of one sequence in the tiles' order (token_attention_bf16's arguments: token i sees the
   first ctx[i] of the keys at win): a set is 16 consecutive tokens' queries of one head, in A's rows; a step's keys go
   into B's columns (K's d-pairs down the rows), copied once per KV head and step for all of a thread's sets. The
   (KV head, block of 16 tokens) pairs go to the threads in turn; a thread keeps its sets' states for one KV head at a
   time, so its memory grows with the chunk, not the context. */
TGT int tile_tokens_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, const int64_t *win,
                         const int64_t *ctx, uint16_t *out, int64_t R, int64_t H, int64_t KVH, int64_t D, float scale,
                         int nthreads) {
    if (D % 32 || D > MAXD || H % KVH || R < 1) return 2;
    if (nthreads < 1) nthreads = 1;
    int64_t G = H / KVH, KD = KVH * D, blocks = (R + 15) / 16, L = 0;
    for (int64_t i = 0; i < R; i++) L = ctx[i] > L ? ctx[i] : L;
    int64_t mine = (blocks + nthreads - 1) / nthreads;               /* a thread's blocks under a KV head, at most */
    /* per set: queries (16 x D bfloat16), max, lanewise sums, output */
    int64_t set_floats = 8 * D + 16 + 256 + 16 * D;
    /* per thread: a step's K pairs and V pairs, scores, weights, the tile's output, then its sets */
    int64_t step_floats = 16 * D + 16 * D + 16 * KT + 16 * KT / 2 + 16 * D;
    int64_t per = step_floats + mine * G * set_floats;
    float *scratch = aligned_alloc(64, (size_t)per * 4 * nthreads);
    if (!scratch) return 1;
    #pragma omp parallel num_threads(nthreads)
    {
        tiles_on();
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        float *f = scratch + per * t;
        uint32_t *kt = (uint32_t *)f;
        uint16_t *vp = (uint16_t *)(f + 16 * D), *p = (uint16_t *)(f + 32 * D + 16 * KT);
        float *s = f + 32 * D, *o = f + 32 * D + 16 * KT + 16 * KT / 2, *sets = f + step_floats;
        for (int64_t h = 0; h < KVH; h++) {
            /* the thread's blocks under this KV head: (head, block) pairs dealt in turn, so that even one block's
               heads spread over the threads */
            int64_t nb = 0, lastj = -1, bl[mine], tops[mine];
            for (int64_t b = 0; b < blocks; b++) {
                if ((h * blocks + b) % nt != t) continue;
                bl[nb] = b;
                tops[nb] = 0;                                           /* the block's most keys */
                for (int64_t i = b * 16; i < min64(R, b * 16 + 16); i++)
                    tops[nb] = ctx[i] > tops[nb] ? ctx[i] : tops[nb];
                lastj = (tops[nb] - 1) / KT > lastj ? (tops[nb] - 1) / KT : lastj;
                nb++;
            }
            for (int64_t bi = 0; bi < nb; bi++)
                for (int64_t gi = 0; gi < G; gi++) {
                    float *st = sets + (bi * G + gi) * set_floats;
                    uint16_t *qs = (uint16_t *)st;
                    int64_t b = bl[bi], rows = min64(16, R - b * 16);
                    for (int64_t c = 0; c < 16; c++)
                        if (c < rows) memcpy(qs + c * D, q + ((b * 16 + c) * H + h * G + gi) * D, D * 2);
                        else memset(qs + c * D, 0, D * 2);
                    for (int64_t c = 0; c < 16; c++) st[8 * D + c] = -INFINITY;
                    memset(st + 8 * D + 16, 0, (256 + 16 * D) * 4);
                }
            for (int64_t j = 0; j <= lastj; j++) {
                int64_t valid = min64(KT, L - j * KT);
                const uint16_t *krow[KT], *vrow[KT];
                for (int64_t u = 0; u < valid; u++) {
                    krow[u] = k + win[j * KT + u] * KD + h * D;
                    vrow[u] = v + win[j * KT + u] * KD + h * D;
                }
                k_pairs(krow, valid, D, kt);                    /* the scores' B: K's d-pairs down the rows */
                v_pairs(vrow, valid, D, vp);
                for (int64_t bi = 0; bi < nb; bi++) {
                    int64_t b = bl[bi], rows = min64(16, R - b * 16);
                    if (tops[bi] <= j * KT) continue;
                    for (int64_t gi = 0; gi < G; gi++) {
                        float *st = sets + (bi * G + gi) * set_floats, *m = st + 8 * D, *lv = m + 16, *acc = lv + 256;
                        uint16_t *qs = (uint16_t *)st;
#ifdef NO_TILES
                        step_scores(qs, D, rows, kt, D, s);
#else
                        _tile_zero(0); _tile_zero(1);
                        for (int64_t dt = 0; dt < D / 32; dt++) {
                            _tile_loadd(4, qs + dt * 32, D * 2);
                            _tile_loadd(5, kt + dt * 256, 64);
                            _tile_loadd(6, kt + (D / 32 + dt) * 256, 64);
                            _tile_dpbf16ps(0, 4, 5);
                            _tile_dpbf16ps(1, 4, 6);
                        }
                        _tile_stored(0, s, KT * 4);
                        _tile_stored(1, s + 16, KT * 4);
#endif
                        float alpha[16];
                        int64_t sees[16];
                        for (int64_t c = 0; c < 16; c++) sees[c] = c < rows ? min64(KT, ctx[b * 16 + c] - j * KT) : 0;
                        online_step(s, sees, 16, scale, m, lv, p, alpha);
                        weighted_v(p, vp, D, o, rows);
                        acc_step(acc, o, alpha, sees, rows, D);
                    }
                }
            }
            for (int64_t bi = 0; bi < nb; bi++)
                for (int64_t gi = 0; gi < G; gi++) {
                    float *st = sets + (bi * G + gi) * set_floats, *lv = st + 8 * D + 16, *acc = lv + 256;
                    int64_t b = bl[bi], rows = min64(16, R - b * 16);
                    for (int64_t c = 0; c < rows; c++)
                        finish_row(acc + c * D, lv + c * 16, D, out + ((b * 16 + c) * H + h * G + gi) * D);
                }
        }
        TILES_OFF();
    }
    free(scratch);
    return 0;
}
