/* prefill_attention.c: causal prefill attention for one chunk of a sequence, read from the paged KV pool, bfloat16.

   Computes  softmax(q k^T * scale) v for the chunk's n queries (the last n of L tokens), each over the keys up to
             its own position, on AMX tiles or, built with NO_TILES, AVX512-BF16 dot products.
   Entry     prefill_amx_enable (the tile state) and prefill_attention_bf16 (2 for a shape it does not take, 1 when
             out of memory).
   Build     PREFILL_KERNEL_FLAGS in nanoserve/prefill_kernel.py: -O3 -fopenmp -fPIC -shared -std=c11, as
             'prefill_attention' (AMX) or 'prefill_attention_dots' (-DNO_TILES), by PREFILL_BUILDS (prefill_kernel).
   Checked   nbs/11_prefill_kernel.ipynb, "Checks": the kernel against SDPA and float64 on chunk shapes;
             tests/test_fast.py::test_prefill_kernel_greedy_text_equals_sdpa. */

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
