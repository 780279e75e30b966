/* f32_linear.c: float32 products for decode batches over weights packed once, with AVX-512 or AVX2.

   Computes  y = x @ w.T (+ b) for up to F32_MAX_ROWS rows, each output summed in blocks of 64 inputs in a fixed
             order, so a row's bits do not depend on the rows beside it.
   Entry     f32_packed_size and f32_pack (w [N, K] -> blocks of 32 outputs, [K][32] each), f32_linear (AVX-512F)
             and f32_linear_avx2 (AVX2 and FMA), each compiled for its instructions by a target attribute.
   Build     F32_LINEAR_FLAGS in nanoserve/f32_linear.py: -O3 -fopenmp -fPIC -shared -std=c11 (f32_kernel).
   Checked   nbs/06_f32_linear.ipynb, "Checks": both versions against F.linear and float64;
             tests/test_fast.py::test_f32_products_greedy_text_equals_onednn. */

/* float32 products y = x @ w.T (+ b) for decode batches (up to a few dozen rows), over weights packed once, with
   AVX-512 or AVX2. Each version is compiled for its instructions whatever the machine (a target attribute), and
   called only where the CPU has them. */
#include <stdint.h>
#include <string.h>
#include <immintrin.h>
#include <omp.h>

#define NB 32                  /* output columns of a packed block: two 16-float registers */
/* rows a pass keeps in registers: 12 x 2 accumulators, 2 weight vectors, 1 broadcast of 32 */
#define MR 12
#define KC 64                  /* inputs summed in one run before the run is added to the output's total */
#define AHEAD 32               /* inputs ahead that the first pass over a block asks the memory for (4 KiB) */
#define TGT __attribute__((target("avx512f")))
#define TGT2 __attribute__((target("avx2,fma")))
/* AVX2: rows a pass keeps in registers: 6 x 2 accumulators, 2 weight vectors, 1 broadcast of 16 */
#define MR2 6
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* w [N, K] -> blocks of 32 output columns, each [K][32] (columns past N zeros): a block is read front to back, once
   per pass. */
int64_t f32_packed_size(int64_t N, int64_t K) { return (N + NB - 1) / NB * NB * K; }
int f32_block_cols(void) { return NB; }

void f32_pack(const float *w, float *p, int64_t N, int64_t K) {
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < (N + NB - 1) / NB; b++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < NB; j++)
                p[(b * K + k) * NB + j] = b * NB + j < N ? w[(b * NB + j) * K + k] : 0.f;
}

/* mr rows of x (K apart) against one block.  Each output is summed over its inputs in runs of KC, in order, one FMA
   a step; the runs' sums are added in order, and the bias last.  That is a blocked sum: its rounding error grows
   with KC + K / KC, not with K.  Nothing in it depends on which rows share the pass.  mr is a constant where this is
   inlined (see PASS). */
TGT static inline __attribute__((always_inline)) void pass(const float *x, int64_t K, const float *blk, float *out,
        int64_t ldo, const int mr, const float *bias, __mmask16 m0, __mmask16 m1, int first) {
    __m512 s0[MR], s1[MR];
    for (int r = 0; r < mr; r++) { s0[r] = _mm512_setzero_ps(); s1[r] = _mm512_setzero_ps(); }
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        __m512 c0[MR], c1[MR];
        for (int r = 0; r < mr; r++) { c0[r] = _mm512_setzero_ps(); c1[r] = _mm512_setzero_ps(); }
        for (int64_t k = k0; k < min64(K, k0 + KC); k++) {
            if (first) {
                _mm_prefetch((const char *)(blk + (k + AHEAD) * NB), _MM_HINT_T0);
                _mm_prefetch((const char *)(blk + (k + AHEAD) * NB + 16), _MM_HINT_T0);
            }
            __m512 w0 = _mm512_loadu_ps(blk + k * NB), w1 = _mm512_loadu_ps(blk + k * NB + 16);
            for (int r = 0; r < mr; r++) {
                __m512 a = _mm512_set1_ps(x[r * K + k]);
                c0[r] = _mm512_fmadd_ps(a, w0, c0[r]); c1[r] = _mm512_fmadd_ps(a, w1, c1[r]);
            }
        }
        for (int r = 0; r < mr; r++) { s0[r] = _mm512_add_ps(s0[r], c0[r]); s1[r] = _mm512_add_ps(s1[r], c1[r]); }
    }
    __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps(),
           b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    for (int r = 0; r < mr; r++) {
        _mm512_mask_storeu_ps(out + r * ldo, m0, bias ? _mm512_add_ps(s0[r], b0) : s0[r]);
        _mm512_mask_storeu_ps(out + r * ldo + 16, m1, bias ? _mm512_add_ps(s1[r], b1) : s1[r]);
    }
}
#define PASS(n) case n: pass(x + m * K, K, blk, out + m * N + n0, N, n, bias ? bias + n0 : 0, k0, k1, i == 0); break;

/* Rows go in chunks of about CHUNK_BYTES of x (a decode's few rows are one chunk), each chunk over every block of the
   thread's, so that a chunk's rows stay in the core's cache while the blocks stream by: a prefill's 4,096 rows of 576
   inputs (9.4 MB) were read once a block, and the product ran 15% behind oneDNN's.  Which rows share a chunk or a pass
   changes no row's sums. */
#define CHUNK_BYTES (1 << 19)
static inline int64_t chunk_rows(int64_t K, int64_t bytes, int64_t unit) {
    int64_t r = CHUNK_BYTES / (K * bytes) / unit * unit;
    return r < unit ? unit : r;
}

/* The blocks are split across threads; within a block a chunk's rows go in nearly equal passes of at most MR (32
   rows: 11, 11, 10).  The first pass streams the block from memory, prefetching ahead; the others find it in cache. */
TGT void f32_linear(const float *x, const float *p, const float *bias, float *out, int64_t M, int64_t N, int64_t K,
                    int nthreads) {
    int64_t nblocks = (N + NB - 1) / NB, mc = chunk_rows(K, sizeof(float), MR);
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int64_t c0 = 0; c0 < M; c0 += mc) {
            int64_t rc = min64(mc, M - c0), npass = (rc + MR - 1) / MR;
            for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
                int64_t n0 = b * NB, nc = min64(NB, N - n0);
                __mmask16 k0 = nc >= 16 ? 0xffff : (__mmask16)((1u << nc) - 1);
                __mmask16 k1 = nc >= 32 ? 0xffff : nc <= 16 ? 0 : (__mmask16)((1u << (nc - 16)) - 1);
                const float *blk = p + n0 * K;
                for (int64_t i = 0; i < npass; i++) {
                    int64_t m = c0 + rc * i / npass, rows = c0 + rc * (i + 1) / npass - m;
                    switch (rows) {
                        PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6)
                        PASS(7) PASS(8) PASS(9) PASS(10) PASS(11) PASS(12)
                    }
                }
            }
        }
    }
}

/* The same sums with AVX2's 8-float registers, for CPUs without AVX-512.  A pass covers nv vectors of 8 outputs: a
   whole block (nv = 4) for one or two rows, which then stream the block front to back, or half of one (nv = 2, one
   64-byte line per input) for up to 6 rows, 12 accumulators, 2 weight vectors and 1 broadcast: 15 of the 16
   registers.  Every output is summed as pass() sums it (runs of KC in order, one FMA a step, the runs added in
   order, the bias last), so the two versions give the same bits. */
TGT2 static inline __attribute__((always_inline)) void pass2(const float *x, int64_t K, const float *w, float *out,
        int64_t ldo, const int mr, const int nv, const float *bias, int nc, int first) {
    __m256 s[MR2][4];
    for (int r = 0; r < mr; r++) for (int j = 0; j < nv; j++) s[r][j] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        __m256 c[MR2][4];
        for (int r = 0; r < mr; r++) for (int j = 0; j < nv; j++) c[r][j] = _mm256_setzero_ps();
        for (int64_t k = k0; k < min64(K, k0 + KC); k++) {
            if (first)
                for (int j = 0; j < nv; j += 2) _mm_prefetch((const char *)(w + (k + AHEAD) * NB + 8 * j), _MM_HINT_T0);
            __m256 wv[4];
            for (int j = 0; j < nv; j++) wv[j] = _mm256_loadu_ps(w + k * NB + 8 * j);
            for (int r = 0; r < mr; r++) {
                __m256 a = _mm256_broadcast_ss(x + r * K + k);
                for (int j = 0; j < nv; j++) c[r][j] = _mm256_fmadd_ps(a, wv[j], c[r][j]);
            }
        }
        for (int r = 0; r < mr; r++) for (int j = 0; j < nv; j++) s[r][j] = _mm256_add_ps(s[r][j], c[r][j]);
    }
    /* the bias, zeros past the nc outputs there are; a short pass's rows go through y */
    float b[32] = {0}, y[32];
    if (bias) memcpy(b, bias, sizeof(float) * nc);
    for (int r = 0; r < mr; r++) {
        float *o = nc == 8 * nv ? out + r * ldo : y;
        for (int j = 0; j < nv; j++)
            _mm256_storeu_ps(o + 8 * j, bias ? _mm256_add_ps(s[r][j], _mm256_loadu_ps(b + 8 * j)) : s[r][j]);
        if (nc < 8 * nv) memcpy(out + r * ldo, y, sizeof(float) * nc);
    }
}
#define PASS2(n) case n: pass2(x + m * K, K, half, out + m * N + n0, N, n, 2, bias ? bias + n0 : 0, nc, i == 0); \
    break;

TGT2 void f32_linear_avx2(const float *x, const float *p, const float *bias, float *out, int64_t M, int64_t N,
                          int64_t K, int nthreads) {
    int64_t nblocks = (N + NB - 1) / NB, mc = chunk_rows(K, sizeof(float), MR2);
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int64_t c0 = 0; c0 < M; c0 += mc) {
            int64_t rc = min64(mc, M - c0), npass = (rc + MR2 - 1) / MR2;
            for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
                const float *blk = p + b * NB * K;
                if (M <= 2) {                          /* one pass over the whole block */
                    int64_t n0 = b * NB;
                    int nc = (int)min64(NB, N - n0);
                    if (M == 1) pass2(x, K, blk, out + n0, N, 1, 4, bias ? bias + n0 : 0, nc, 1);
                    else pass2(x, K, blk, out + n0, N, 2, 4, bias ? bias + n0 : 0, nc, 1);
                    continue;
                }
                for (int64_t h = 0; h < 2 && b * NB + h * 16 < N; h++) {
                    int64_t n0 = b * NB + h * 16;
                    int nc = (int)min64(16, N - n0);
                    const float *half = blk + h * 16;
                    for (int64_t i = 0; i < npass; i++) {
                        int64_t m = c0 + rc * i / npass, rows = c0 + rc * (i + 1) / npass - m;
                        switch (rows) { PASS2(1) PASS2(2) PASS2(3) PASS2(4) PASS2(5) PASS2(6) }
                    }
                }
            }
        }
    }
}
