/* int8_linear.c: integer products, W8A8 and W4A8: activations quantized to int8 a group of inputs at a time, int32
   sums.

   Computes  y = x @ w.T (+ b) for bfloat16 x [M, K] and weights quantized to int8 (one scale an output column,
             w ~ q * s) or to int4 in groups (w = (q - 8) * s + z, a scale and a zero a group of g inputs and column):
             each row of x is quantized to int8 a group of inputs at a time, with one scale a group (its largest |x|
             maps to 127; groups of A8_GROUP = 64 for W8A8, of the weights' g for W4A8), each group's products are
             summed in int32, and the group's scales applied to its sum; float32 from there, group after group.
             bfloat16 out, rounded to nearest even, or the float32 values where the caller asks (the last argument).
   Entry     a8_enable (asks Linux for the tile state), a8_tiles (1: this build has them), a8_quantize (the rows'
             codes and scales, for the reference), w8a8_packed_size, w8a8_pack, w8a8_linear, w4a8_packed_size,
             w4a8_pack, w4a8_linear; linear_many, many products of one shape in one call (a mixture of experts'
             experts, each over its own rows).
   Build     INT8_FLAGS in nanoserve/integer.py: -O3 -fopenmp -fPIC -shared -std=c11, as 'int8_linear' (AMX-INT8 tiles
             past TILE_ROWS rows, AVX512-VNNI dot products up to it) or 'int8_dot_linear' (-DNO_TILES: a CPU with
             AVX512-VNNI and no AMX, dot products at every row count).  TILE_ROWS may be set with -D to measure.
   Checked   nbs/06_integer.ipynb: each product against its integer reference in PyTorch, bit for bit, and its rows'
             bits across row and thread counts; tests/test_integer.py; linear_many in nbs/06_grouped_experts.ipynb.

   Why a row's bits never depend on its batch: a group's sum is an integer, exact in any order, so the tiles and the
   dot products give the same int32 for a row's group whatever the number of rows, the path or the threads; what
   follows (each group's scales, added group after group in order, then the column's scale and the bias, the rounding)
   is the same float32 operations in the same order for every row.  A group's int32 sum holds 255 * 127 * 64. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>
#include <omp.h>

#ifdef NO_TILES
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))
#define TILE_ROWS (1 << 30)                 /* no tiles: the dot products take every row count */
#else
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,amx-tile,amx-int8")))
/* products of more rows than this take the tiles; up to it, the dot products */
#ifndef TILE_ROWS
#define TILE_ROWS 4
#endif
#endif
/* W8A8's activation group: a tile's depth (a multiple of 64 may be set with -D to measure what groups cost:
   bench/experiments/int8_groups.py) */
#ifndef A8_GROUP
#define A8_GROUP 64
#endif
#define NB 64                               /* output columns of a W8A8 block: four vectors, or four tiles, of 16 */
#define ROWS 6                              /* rows of a dot-product pass: 6 x 2 int32 and 6 x 2 float32 sums */
#define Q4_NB 32                            /* output columns of a W4A8 block: two vectors */
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int a8_enable(void) {
#ifdef NO_TILES
    return 0;
#else
    return (int)syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
#endif
}
int a8_tiles(void) {
#ifdef NO_TILES
    return 0;
#else
    return 1;
#endif
}

TGT static inline __m512 widen(const uint16_t *x) {         /* 16 bfloat16 -> float32, exactly */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)x)), 16));
}

/* The codes of a row's group of g inputs (bfloat16; g a multiple of 16): amax the group's largest |x|,
   xq[k] = x * (127 / amax) rounded to the nearest integer (ties to even: the CPU's rounding mode, as torch.round), and
   the scale amax / 127: x ~ xq * scale.  A group of zeros has codes 0 and scale 0; a group holding a NaN has the
   scale NaN (max would drop it), so its row's outputs are NaN, as a float product's would be. */
TGT static float quantize_group(const uint16_t *x, int8_t *xq, int64_t g) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t k = 0; k < g; k += 16) {
        __m512 v = widen(x + k);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    float amax = nan ? __builtin_nanf("") : _mm512_reduce_max_ps(mx);
    __m512 iv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    /* |x * inv| <= 127 up to one rounding: the saturating narrowing keeps the codes in int8 */
    for (int64_t k = 0; k < g; k += 16)
        _mm_storeu_si128((__m128i *)(xq + k),
                         _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(widen(x + k), iv))));
    return amax / 127.0f;
}

/* x [M, K] -> codes xq [M, K] and scales xs [M, K / g], a group at a time (K a multiple of g) */
void a8_quantize(const uint16_t *x, int8_t *xq, float *xs, int64_t M, int64_t K, int64_t g, int nthreads) {
    int64_t G = K / g;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t i = 0; i < G; i++) xs[m * G + i] = quantize_group(x + m * K + i * g, xq + m * K + i * g, g);
}

/* float32 -> bfloat16, to nearest, ties to even, as PyTorch rounds (a NaN stays a NaN): integer operations, so that a
   CPU with VNNI and no AVX512-BF16 (Cascade Lake, Ice Lake) runs the kernel too */
TGT static inline __m256i to_bf16(__m512 y) {
    __m512i u = _mm512_castps_si512(y);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(r);
}

/* One output vector (up to 16 columns, mask m): y = f * scale (null: none) + bias (null: none), stored as bfloat16 or
   (f32) float32.  The integer reference in nanoserve/integer.py does the same operations in the same order. */
TGT static inline void store_vec(void *out, __mmask16 m, __m512 f, const float *scale, const uint16_t *bias,
                                 const int f32) {
    if (scale) f = _mm512_mul_ps(f, _mm512_maskz_loadu_ps(m, scale));
    if (bias) {
        __m512i bw = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, bias));
        f = _mm512_add_ps(f, _mm512_castsi512_ps(_mm512_slli_epi32(bw, 16)));
    }
    if (f32) _mm512_mask_storeu_ps(out, m, f);
    else _mm256_mask_storeu_epi16(out, m, to_bf16(f));
}
static inline __mmask16 cols_mask(int64_t n) { return n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1); }

/* element i of an output row: bfloat16, or float32 with f32 */
#define OUT_AT(out, i, f32) ((char *)(out) + (i) * ((f32) ? 4 : 2))

/* ---- W8A8 ----
   sum_k x_k w_k = s * sum_groups xs_group * sum_{k in group} xq_k q_k: per group of A8_GROUP inputs an int32 sum,
   then f = fma(sum, xs_group, f) in float32, group after group, and y = f * s (+ b) at the end.
   The layout: the columns' scales (Np float32, Np = N rounded up to 16), each group's corrections 128 * sum_k q
   ([K / A8_GROUP][Np] int32: the dot products', below), then blocks of NB columns (the last narrower, columns past N
   zeros), each [K/4][nb][4]: four inputs of every column side by side, which is both the layout an AMX B tile is
   loaded from (16 columns x 4 inputs a 64-byte row, nb * 4 bytes apart) and the one vpdpbusd reads (a vector: 16
   columns x 4 inputs).  K a multiple of 64. */
int64_t w8a8_packed_size(int64_t N, int64_t K) {
    int64_t Np = (N + 15) / 16 * 16;
    return 4 * Np + 4 * Np * (K / A8_GROUP) + Np * K;
}

void w8a8_pack(const int8_t *q, const float *scale, uint8_t *p, int64_t N, int64_t K) {
    int64_t Np = (N + 15) / 16 * 16, G = K / A8_GROUP;
    float *s = (float *)p;
    int32_t *corr = (int32_t *)(p + 4 * Np);
    int8_t *blocks = (int8_t *)(p + 4 * Np + 4 * Np * G);
    for (int64_t n = 0; n < Np; n++) {
        s[n] = n < N ? scale[n] : 0.0f;
        for (int64_t gi = 0; gi < G; gi++) {
            int32_t sum = 0;
            for (int64_t k = gi * A8_GROUP; n < N && k < (gi + 1) * A8_GROUP; k++) sum += q[n * K + k];
            corr[gi * Np + n] = 128 * sum;
        }
    }
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < (Np + NB - 1) / NB; b++) {
        int64_t n0 = b * NB, nb = min64(NB, Np - n0);
        for (int64_t k4 = 0; k4 < K / 4; k4++)
            for (int64_t j = 0; j < nb; j++)
                for (int64_t d = 0; d < 4; d++)
                    blocks[n0 * K + (k4 * nb + j) * 4 + d] = n0 + j < N ? q[(n0 + j) * K + 4 * k4 + d] : 0;
    }
}

/* mr rows (up to ROWS) against nv (1 or 2) vectors of a block's columns, from column c0 of a block nb wide, with
   vpdpbusd: xt holds the rows' codes plus 128 (unsigned), a word of four inputs each, [K/4][ldx], xs their group
   scales ([rows][G]); the weights are signed.  So each group's sum is sum_k (xq + 128) q, less the group's correction
   128 * sum_k q: exactly sum_k xq q. */
TGT static inline __attribute__((always_inline)) void w8_pass(const int32_t *xt, int64_t ldx, const float *xs,
        int64_t K, const int8_t *blk, int64_t nb, int64_t c0, const int32_t *corr, int64_t Np, const float *scale,
        const uint16_t *bias, void *out, int64_t ldo, int64_t ncols, const int mr, const int nv, const int f32) {
    __m512 f[ROWS][2];
    int64_t G = K / A8_GROUP;
    for (int r = 0; r < mr; r++) for (int j = 0; j < nv; j++) f[r][j] = _mm512_setzero_ps();
    for (int64_t gi = 0; gi < G; gi++) {
        __m512i acc[ROWS][2];
        for (int r = 0; r < mr; r++) for (int j = 0; j < nv; j++) acc[r][j] = _mm512_setzero_si512();
        for (int64_t k4 = gi * (A8_GROUP / 4); k4 < (gi + 1) * (A8_GROUP / 4); k4++) {
            const int8_t *w = blk + k4 * nb * 4 + c0 * 4;
            _mm_prefetch((const char *)w + 4096, _MM_HINT_T0);
            if (nv > 1) _mm_prefetch((const char *)w + 4096 + 64, _MM_HINT_T0);
            __m512i wv[2];
            for (int j = 0; j < nv; j++) wv[j] = _mm512_loadu_si512(w + 64 * j);
            const int32_t *a = xt + k4 * ldx;
            for (int r = 0; r < mr; r++) {
                __m512i b = _mm512_set1_epi32(a[r]);
                for (int j = 0; j < nv; j++) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], b, wv[j]);
            }
        }
        for (int j = 0; j < nv; j++) {
            __m512i cr = _mm512_loadu_si512(corr + gi * Np + c0 + 16 * j);
            for (int r = 0; r < mr; r++)
                f[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][j], cr)),
                                          _mm512_set1_ps(xs[r * G + gi]), f[r][j]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nv && 16 * j < ncols; j++)
            store_vec(OUT_AT(out, r * ldo + 16 * j, f32), cols_mask(ncols - 16 * j), f[r][j], scale + c0 + 16 * j,
                      bias ? bias + c0 + 16 * j : 0, f32);
}
#define W8(n) case n: \
    for (int64_t c0 = 0; c0 < nb; c0 += 32) { \
        if (nb - c0 >= 32) w8_pass(xt + m * K4, ld, xs + m * G, K, blk, nb, c0, corr + n0, Np, scale + n0, \
                                   bias ? bias + n0 : 0, OUT_AT(out, m * N + n0 + c0, f32), N, \
                                   min64(32, N - n0 - c0), n, 2, f32); \
        else w8_pass(xt + m * K4, ld, xs + m * G, K, blk, nb, c0, corr + n0, Np, scale + n0, bias ? bias + n0 : 0, \
                     OUT_AT(out, m * N + n0 + c0, f32), N, min64(16, N - n0 - c0), n, 1, f32); \
    } break;

/* The dot products: the rows' codes plus 128 in panels of ROWS rows ([K/4][ROWS] words each), the blocks split across
   threads, each block's rows in passes of ROWS over 32 columns at a time (the first pass reads the block from memory,
   the rest from cache). */
TGT static int w8_dots(const int8_t *xq, const float *xs, const uint8_t *p, const uint16_t *bias, void *out,
                       int64_t M, int64_t N, int64_t K, int nthreads, const int f32) {
    int64_t Np = (N + 15) / 16 * 16, nblocks = (Np + NB - 1) / NB, K4 = K / 4, G = K / A8_GROUP;
    const float *scale = (const float *)p;
    const int32_t *corr = (const int32_t *)(p + 4 * Np);
    const int8_t *blocks = (const int8_t *)(p + 4 * Np + 4 * Np * G);
    int64_t panels = (M + ROWS - 1) / ROWS, ld = M > 1 ? ROWS : 1;
    int32_t *xt = malloc(panels * ROWS * K4 * 4);
    if (!xt) return 1;
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int32_t *xw = (const int32_t *)xq;
        for (int64_t q = panels * t / nt; q < panels * (t + 1) / nt; q++)
            for (int64_t m = q * ROWS; m < min64(M, (q + 1) * ROWS); m++)
                for (int64_t k = 0; k < K4; k++)          /* a word's four codes plus 128: their top bits flipped */
                    xt[q * ROWS * K4 + k * ld + m % ROWS] = xw[m * K4 + k] ^ (int32_t)0x80808080u;
        _Pragma("omp barrier")
        for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
            int64_t n0 = b * NB, nb = min64(NB, Np - n0);
            const int8_t *blk = blocks + n0 * K;
            for (int64_t m = 0; m < M; m += ROWS)
                switch (min64(ROWS, M - m)) { W8(1) W8(2) W8(3) W8(4) W8(5) W8(6) }
        }
    }
    free(xt);
    return 0;
}

#ifndef NO_TILES
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg;

/* The tiles (tdpbssd: signed codes times signed weights, no correction): 0-3 a group's sums (int32, 16 rows x 16
   columns each: the block's 64), 4 the codes (16 rows x 64 inputs: a group, or a step of one), 5-7 the weights (16
   words of 4 inputs x 16 columns).  For each 16 rows: a group's sums in four tiles, stored, and added into the rows'
   float32 sums times their group scales, group after group; the blocks split across threads.  xq and xs padded to Mp
   rows (zeros).
   (Tried: 16 x 16 outputs a pass with their float32 sums in registers and two groups in flight, 0.8x of this: the
   codes' tile loaded again for each 16 columns.) */
TGT static void w8_tiles(const int8_t *xq, const float *xs, const uint8_t *p, const uint16_t *bias, void *out,
                         int64_t M, int64_t Mp, int64_t N, int64_t K, int nthreads, const int f32) {
    int64_t Np = (N + 15) / 16 * 16, nblocks = (Np + NB - 1) / NB, G = K / A8_GROUP;
    const float *scale = (const float *)p;
    const int8_t *blocks = (const int8_t *)(p + 4 * Np + 4 * Np * G);
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        tilecfg cfg = {0};
        cfg.palette = 1;
        for (int i = 0; i < 8; i++) {
            cfg.rows[i] = 16;
            cfg.colsb[i] = 64;
        }
        _tile_loadconfig(&cfg);
        int32_t c[16 * NB] __attribute__((aligned(64)));
        float f[16 * NB] __attribute__((aligned(64)));      /* the float32 sums of 16 rows x the block's columns */
        for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
            int64_t n0 = b * NB, nb = min64(NB, Np - n0), ldb = nb * 4, nv = nb / 16;
            const int8_t *blk = blocks + n0 * K;
            for (int64_t m0 = 0; m0 < Mp; m0 += 16) {
                memset(f, 0, sizeof f);
                for (int64_t gi = 0; gi < G; gi++) {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                    for (int64_t k = gi * A8_GROUP; k < (gi + 1) * A8_GROUP; k += 64) {     /* a tile's depth a step */
                        const int8_t *bk = blk + k * nb;             /* 64 inputs of the block: nb * 64 bytes */
                        if (m0 == 0)                     /* the first 16 rows stream the block: ask ahead */
                            for (int64_t l = 0; l < nb * 64; l += 64)
                                _mm_prefetch((const char *)bk + 8192 + l, _MM_HINT_T0);
                        _tile_loadd(4, xq + m0 * K + k, K);
                        _tile_loadd(5, bk, ldb);
                        _tile_dpbssd(0, 4, 5);
                        if (nv > 1) {
                            _tile_loadd(6, bk + 64, ldb);
                            _tile_dpbssd(1, 4, 6);
                        }
                        if (nv > 2) {
                            _tile_loadd(7, bk + 128, ldb);
                            _tile_dpbssd(2, 4, 7);
                        }
                        if (nv > 3) {
                            _tile_loadd(5, bk + 192, ldb);
                            _tile_dpbssd(3, 4, 5);
                        }
                    }
                    _tile_stored(0, c, NB * 4);
                    if (nv > 1) _tile_stored(1, c + 16, NB * 4);
                    if (nv > 2) _tile_stored(2, c + 32, NB * 4);
                    if (nv > 3) _tile_stored(3, c + 48, NB * 4);
                    for (int r = 0; r < 16; r++) {
                        __m512 sr = _mm512_set1_ps(xs[(m0 + r) * G + gi]);
                        for (int j = 0; j < nv; j++) {
                            float *fr = f + r * NB + 16 * j;
                            __m512 d = _mm512_cvtepi32_ps(_mm512_load_si512(c + r * NB + 16 * j));
                            _mm512_store_ps(fr, _mm512_fmadd_ps(d, sr, _mm512_load_ps(fr)));
                        }
                    }
                }
                for (int r = 0; r < 16 && m0 + r < M; r++)
                    for (int j = 0; j < nv && n0 + 16 * j < N; j++)
                        store_vec(OUT_AT(out, (m0 + r) * N + n0 + 16 * j, f32), cols_mask(N - n0 - 16 * j),
                                  _mm512_load_ps(f + r * NB + 16 * j), scale + n0 + 16 * j,
                                  bias ? bias + n0 + 16 * j : 0, f32);
            }
        }
        _tile_release();
    }
}
#endif

/* y = x @ (q * s).T (+ b) over w8a8_pack's layout: x quantized a group at a time, then the tiles past TILE_ROWS rows
   and the dot products up to it.  0; 1 when out of memory; 2 when K is not a positive multiple of 64. */
TGT int w8a8_linear(const uint16_t *x, const void *packed, const uint16_t *bias, void *out, int64_t M, int64_t N,
                    int64_t K, int nthreads, int f32) {
    if (K < A8_GROUP || K % A8_GROUP) return 2;
    if (M < 1) return 0;
    int64_t Mp = M > TILE_ROWS ? (M + 15) / 16 * 16 : M, G = K / A8_GROUP;
    int8_t *xq = aligned_alloc(64, (Mp * K + 63) / 64 * 64);
    float *xs = malloc(Mp * G * 4);
    if (!xq || !xs) {
        free(xq);
        free(xs);
        return 1;
    }
    a8_quantize(x, xq, xs, M, K, A8_GROUP, nthreads);
    memset(xq + M * K, 0, (Mp - M) * K);
    memset(xs + M * G, 0, (Mp - M) * G * 4);
    int rc = 0;
#ifndef NO_TILES
    if (M > TILE_ROWS) w8_tiles(xq, xs, packed, bias, out, M, Mp, N, K, nthreads, f32);
    else
#endif
    rc = w8_dots(xq, xs, packed, bias, out, M, N, K, nthreads, f32);
    free(xq);
    free(xs);
    return rc;
}

/* ---- W4A8 ----
   Codes q in 0..15 with a scale s and a zero z a group of g inputs and column: w = (q - 8) s + z; the activations
   quantized in the same groups (x ~ xq * xs, one xs a row's group).  Then
       sum_{k in group} x_k w_k = xs * s * sum_k xq_k q_k  +  (z - 8 s) * xs * sum_k xq_k,
   so each group's int32 dot product of the codes (vpdpbusd: the weights' codes unsigned, the activations' signed, no
   correction) becomes d = float(dot) * s, then f = fma(d, xs, f), then f = fma(c, sx, f) with c = z - 8 s and sx the
   row's xs * sum_k xq_k over the group (float32, once a product), group after group in order; y = f (+ b).
   The layout: a 64-byte head holding g, then blocks of 32 columns, group by group: the group's 32 scales and 32 c
   (float32), then its g / 4 words of four inputs, 64 bytes each: byte i holds, in its low nibble, byte i of the first
   16 columns' vector (column i / 4, input i % 4) and, in its high nibble, the same byte of the next 16 columns'.  g a
   multiple of 16, K of g and of 64. */
static inline int64_t w4_group_bytes(int64_t g) { return 2 * Q4_NB * 4 + g / 4 * 64; }
int64_t w4a8_packed_size(int64_t N, int64_t K, int64_t g) {
    return 64 + (N + Q4_NB - 1) / Q4_NB * (K / g) * w4_group_bytes(g);
}

/* q [N][K] codes (uint8, 0..15), s and c [N][K / g] float32 (c = z - 8 s) */
void w4a8_pack(const uint8_t *q, const float *s, const float *c, uint8_t *p, int64_t N, int64_t K, int64_t g) {
    int64_t nblocks = (N + Q4_NB - 1) / Q4_NB, G = K / g, gb = w4_group_bytes(g);
    memset(p, 0, 64);
    memcpy(p, &g, 8);
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++)
        for (int64_t gi = 0; gi < G; gi++) {
            uint8_t *at = p + 64 + (b * G + gi) * gb;
            float *sc = (float *)at, *cc = sc + Q4_NB;
            for (int64_t j = 0; j < Q4_NB; j++) {
                int64_t n = b * Q4_NB + j;
                sc[j] = n < N ? s[n * G + gi] : 0.0f;
                cc[j] = n < N ? c[n * G + gi] : 0.0f;
            }
            uint8_t *codes = at + 2 * Q4_NB * 4;
            for (int64_t w = 0; w < g / 4; w++)
                for (int64_t i = 0; i < 64; i++) {
                    int64_t k = gi * g + 4 * w + i % 4, lo = b * Q4_NB + i / 4, hi = lo + 16;
                    uint8_t a = lo < N ? q[lo * K + k] & 15 : 0, d = hi < N ? q[hi * K + k] & 15 : 0;
                    codes[w * 64 + i] = (uint8_t)(a | d << 4);
                }
        }
}

/* mr rows (their codes as words [K/4][ldx]; xs and sx their groups' scales and scaled code sums, [rows][G]) against
   one block */
TGT static inline __attribute__((always_inline)) void w4_pass(const int32_t *xt, int64_t ldx, const float *xs,
        const float *sx, int64_t K, int64_t g, const uint8_t *blk, void *out, int64_t ldo, int64_t ncols,
        const uint16_t *bias, const int mr, const int f32) {
    __m512 f[ROWS][2];
    __m512i acc[ROWS][2];
    const __m512i low = _mm512_set1_epi8(15);
    int64_t gb = w4_group_bytes(g), G = K / g;
    for (int r = 0; r < mr; r++) for (int j = 0; j < 2; j++) f[r][j] = _mm512_setzero_ps();
    for (int64_t gi = 0; gi < G; gi++) {
        const uint8_t *at = blk + gi * gb, *codes = at + 2 * Q4_NB * 4;
        const float *sc = (const float *)at, *cc = sc + Q4_NB;
        _mm_prefetch((const char *)at + 2048, _MM_HINT_T0);
        for (int r = 0; r < mr; r++) for (int j = 0; j < 2; j++) acc[r][j] = _mm512_setzero_si512();
        for (int64_t w = 0; w < g / 4; w++) {
            __m512i v = _mm512_loadu_si512(codes + w * 64);
            __m512i wa = _mm512_and_si512(v, low), wb = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            const int32_t *a = xt + (gi * g / 4 + w) * ldx;
            for (int r = 0; r < mr; r++) {
                __m512i bx = _mm512_set1_epi32(a[r]);
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], wa, bx);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], wb, bx);
            }
        }
        for (int j = 0; j < 2; j++) {
            __m512 sj = _mm512_loadu_ps(sc + 16 * j), cj = _mm512_loadu_ps(cc + 16 * j);
            for (int r = 0; r < mr; r++) {
                __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][j]), sj);
                f[r][j] = _mm512_fmadd_ps(d, _mm512_set1_ps(xs[r * G + gi]), f[r][j]);
                f[r][j] = _mm512_fmadd_ps(cj, _mm512_set1_ps(sx[r * G + gi]), f[r][j]);
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 2 && 16 * j < ncols; j++)
            store_vec(OUT_AT(out, r * ldo + 16 * j, f32), cols_mask(ncols - 16 * j), f[r][j], 0,
                      bias ? bias + 16 * j : 0, f32);
}
#define W4(n) case n: w4_pass(xt + q * ROWS * K4, ld, xs + m * G, sx + m * G, K, g, blk, \
                              OUT_AT(out, m * N + n0, f32), N, min64(Q4_NB, N - n0), bias ? bias + n0 : 0, n, f32); \
                      break;

#ifndef NO_TILES
/* The tiles for W4A8 (tdpbssd: the activations' codes times the weights' codes 0..15 as signed bytes): each block's
   codes widened once to int8 in the layout B tiles load (a word of four inputs a column, 16 columns a 64-byte row, the
   block's two halves side by side: [K/4][2][64]), then for each 16 rows, each group's sums in two tiles (0-1: 16 rows
   x 16 columns each), a group of g inputs a tile's depth at a time (2: the codes, 16 rows x up to 64 inputs; 3-4: the
   weights), stored, and added into the rows' float32 sums as the dot products add them: d = float(sum) * s, then
   f = fma(d, xs, f), then f = fma(c, sx, f), group after group.  So a row's bits are the dot products'.  xq, xs and
   sx padded to Mp rows (zeros).  1 when out of memory. */
TGT static int w4_tiles(const int8_t *xq, const float *xs, const float *sx, const uint8_t *p, const uint16_t *bias,
                        void *out, int64_t M, int64_t Mp, int64_t N, int64_t K, int64_t g, int nthreads,
                        const int f32) {
    int64_t nblocks = (N + Q4_NB - 1) / Q4_NB, G = K / g, gb = w4_group_bytes(g), step = g < 64 ? g : 64;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int8_t *wide = aligned_alloc(64, K / 4 * 128);
        float *f = aligned_alloc(64, 16 * Q4_NB * 4);
        int32_t c[16 * Q4_NB] __attribute__((aligned(64)));
        if (!wide || !f) {
            _Pragma("omp atomic write")
            failed = 1;
        }
        else {
            tilecfg cfg = {0};
            cfg.palette = 1;
            for (int i = 0; i < 2; i++) {                /* the sums */
                cfg.rows[i] = 16;
                cfg.colsb[i] = 64;
            }
            cfg.rows[2] = 16;                            /* the codes: 16 rows x step inputs */
            cfg.colsb[2] = (uint16_t)step;
            for (int i = 3; i < 5; i++) {                /* the weights: step / 4 words x 16 columns */
                cfg.rows[i] = (uint8_t)(step / 4);
                cfg.colsb[i] = 64;
            }
            _tile_loadconfig(&cfg);
            const __m512i low = _mm512_set1_epi8(15);
            for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
                int64_t n0 = b * Q4_NB;
                const uint8_t *blk = p + b * G * gb;
                for (int64_t gi = 0; gi < G; gi++) {
                    const uint8_t *codes = blk + gi * gb + 2 * Q4_NB * 4;
                    for (int64_t w = 0; w < g / 4; w++) {
                        __m512i v = _mm512_loadu_si512(codes + w * 64);
                        int8_t *row = wide + (gi * g / 4 + w) * 128;
                        _mm512_store_si512(row, _mm512_and_si512(v, low));
                        _mm512_store_si512(row + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
                    }
                }
                for (int64_t m0 = 0; m0 < Mp; m0 += 16) {
                    memset(f, 0, 16 * Q4_NB * 4);
                    for (int64_t gi = 0; gi < G; gi++) {
                        const float *sc = (const float *)(blk + gi * gb), *cc = sc + Q4_NB;
                        _tile_zero(0);
                        _tile_zero(1);
                        for (int64_t k = gi * g; k < (gi + 1) * g; k += step) {
                            _tile_loadd(2, xq + m0 * K + k, K);
                            _tile_loadd(3, wide + k / 4 * 128, 128);
                            _tile_dpbssd(0, 2, 3);
                            _tile_loadd(4, wide + k / 4 * 128 + 64, 128);
                            _tile_dpbssd(1, 2, 4);
                        }
                        _tile_stored(0, c, Q4_NB * 4);
                        _tile_stored(1, c + 16, Q4_NB * 4);
                        for (int j = 0; j < 2; j++) {
                            __m512 sj = _mm512_loadu_ps(sc + 16 * j), cj = _mm512_loadu_ps(cc + 16 * j);
                            for (int r = 0; r < 16; r++) {
                                float *fr = f + r * Q4_NB + 16 * j;
                                __m512i sum = _mm512_load_si512(c + r * Q4_NB + 16 * j);
                                __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), sj);
                                __m512 xg = _mm512_set1_ps(xs[(m0 + r) * G + gi]);
                                __m512 acc = _mm512_fmadd_ps(d, xg, _mm512_load_ps(fr));
                                _mm512_store_ps(fr, _mm512_fmadd_ps(cj, _mm512_set1_ps(sx[(m0 + r) * G + gi]), acc));
                            }
                        }
                    }
                    for (int r = 0; r < 16 && m0 + r < M; r++)
                        for (int j = 0; j < 2 && n0 + 16 * j < N; j++)
                            store_vec(OUT_AT(out, (m0 + r) * N + n0 + 16 * j, f32), cols_mask(N - n0 - 16 * j),
                                      _mm512_load_ps(f + r * Q4_NB + 16 * j), 0, bias ? bias + n0 + 16 * j : 0,
                                      f32);
                }
            }
            _tile_release();
        }
        free(wide);
        free(f);
    }
    return failed;
}
#endif

/* y = x @ w.T (+ b) over w4a8_pack's layout, any number of rows: the tiles past TILE_ROWS rows (w4_tiles), else the dot
   products: x quantized in the weights' groups, its codes in panels of ROWS rows (words [K/4][ROWS]), each row's scaled
   group sums beside them; the blocks split across threads.  0; 1 when out of memory; 2 when K is not a multiple of g
   and 64, or g of 16. */
TGT int w4a8_linear(const uint16_t *x, const void *packed, const uint16_t *bias, void *out, int64_t M, int64_t N,
                    int64_t K, int nthreads, int f32) {
    int64_t g;
    memcpy(&g, packed, 8);
    if (g < 16 || g % 16 || K < 64 || K % g || K % 64) return 2;
    if (M < 1) return 0;
#ifndef NO_TILES
    if (M > TILE_ROWS) {
        int64_t Mp = (M + 15) / 16 * 16, Gt = K / g;
        int8_t *tq = aligned_alloc(64, (Mp * K + 63) / 64 * 64);
        float *ts = malloc(Mp * Gt * 4), *tsx = malloc(Mp * Gt * 4);
        int rc = 1;
        if (tq && ts && tsx) {
            a8_quantize(x, tq, ts, M, K, g, nthreads);
            memset(tq + M * K, 0, (Mp - M) * K);
            memset(ts + M * Gt, 0, (Mp - M) * Gt * 4);
            memset(tsx + M * Gt, 0, (Mp - M) * Gt * 4);
            #pragma omp parallel for num_threads(nthreads) schedule(static)
            for (int64_t m = 0; m < M; m++)
                for (int64_t gi = 0; gi < Gt; gi++) {
                    int32_t sum = 0;
                    for (int64_t k = gi * g; k < (gi + 1) * g; k++) sum += tq[m * K + k];
                    tsx[m * Gt + gi] = ts[m * Gt + gi] * (float)sum;
                }
            rc = w4_tiles(tq, ts, tsx, (const uint8_t *)packed + 64, bias, out, M, Mp, N, K, g, nthreads, f32);
        }
        free(tq);
        free(ts);
        free(tsx);
        return rc;
    }
#endif
    int64_t nblocks = (N + Q4_NB - 1) / Q4_NB, K4 = K / 4, G = K / g, gb = w4_group_bytes(g);
    int64_t panels = (M + ROWS - 1) / ROWS, ld = M > 1 ? ROWS : 1;
    const uint8_t *p = (const uint8_t *)packed + 64;
    int8_t *xq = aligned_alloc(64, (M * K + 63) / 64 * 64);
    float *xs = malloc(M * G * 4), *sx = malloc(M * G * 4);
    int32_t *xt = M > 1 ? malloc(panels * ROWS * K4 * 4) : 0;
    if (!xq || !xs || !sx || (M > 1 && !xt)) {
        free(xq);
        free(xs);
        free(sx);
        free(xt);
        return 1;
    }
    a8_quantize(x, xq, xs, M, K, g, nthreads);
    if (M == 1) xt = (int32_t *)xq;
    #pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int64_t q = panels * t / nt; q < panels * (t + 1) / nt; q++)
            for (int64_t m = q * ROWS; m < min64(M, (q + 1) * ROWS); m++) {
                const int32_t *xw = (const int32_t *)(xq + m * K);
                if (M > 1) for (int64_t k = 0; k < K4; k++) xt[q * ROWS * K4 + k * ROWS + m % ROWS] = xw[k];
                for (int64_t gi = 0; gi < G; gi++) {
                    int32_t sum = 0;
                    for (int64_t k = gi * g; k < (gi + 1) * g; k++) sum += xq[m * K + k];
                    sx[m * G + gi] = xs[m * G + gi] * (float)sum;
                }
            }
        _Pragma("omp barrier")
        for (int64_t b = nblocks * t / nt; b < nblocks * (t + 1) / nt; b++) {
            int64_t n0 = b * Q4_NB;
            const uint8_t *blk = p + b * G * gb;
            for (int64_t q = 0; q < panels; q++) {
                int64_t m = q * ROWS;
                switch (min64(ROWS, M - m)) { W4(1) W4(2) W4(3) W4(4) W4(5) W4(6) }
            }
        }
    }
    if (M > 1) free(xt);
    free(xq);
    free(xs);
    free(sx);
    return 0;
}

/* G products of one shape, one after another in one call (a mixture of experts' experts, each over its own rows):
   x[i] [M[i], K] @ w[i].T into out[i], bfloat16 and without a bias, through w8a8_linear (kind 0) or w4a8_linear (1),
   each computed as a call of its own computes it.  The first failing product's code, else 0. */
TGT int linear_many(int kind, int64_t G, const uint16_t *const *x, const void *const *w, void *const *out,
                    const int64_t *M, int64_t N, int64_t K, int nthreads) {
    for (int64_t i = 0; i < G; i++) {
        int failed = kind == 0 ? w8a8_linear(x[i], w[i], 0, out[i], M[i], N, K, nthreads, 0)
                   : w4a8_linear(x[i], w[i], 0, out[i], M[i], N, K, nthreads, 0);
        if (failed) return failed;
    }
    return 0;
}
