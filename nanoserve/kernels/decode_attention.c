/* decode_attention.c: paged decode attention, each row's queries over its window read in place from the KV pool.

   Computes  softmax(q k^T * scale) v per query head, for each row over the first ctx[r] slots of its window, in
             float32 (K, V and outputs float32 or bfloat16); a prefill chunk's tokens the same way, each token a row
             of its own whose context is its position + 1, with a decode row's bits.
   Entry     decode_attention_f32 / decode_attention_bf16 (a decode step's rows) and token_attention_f32 /
             token_attention_bf16 (a chunk's tokens, QT at a time); one version per head size 16, 32, 64, 80, 96,
             128 and 256 (2 returned for any other, 1 when out of memory).
   Build     DECODE_KERNEL_FLAGS in nanoserve/attention.py: -O3 -march=native -ffp-contract=fast -fno-trapping-math
             -fno-math-errno -fopenmp, linked with -lmvec -lm (decode_kernel); nbs/12_attention.ipynb also builds it
             with -march=haswell (AVX2 only) to check the generic vector code.
   Checked   nbs/12_attention.ipynb, "Checking both against the reference": the kernel against SDPA with the gather
             (window_attention) and float64, and the chunk entry against the decode rows bit for bit;
             tests/test_fast.py::test_decode_kernel_greedy_text_equals_sdpa, tests/test_batch_invariance.py. */

/* Decode attention read straight from the paged pool.  Row r's H query heads (G = H / KVH to a KV head) attend to
   its first ctx[r] slots of win (its window); each slot's row, every KV head of it, is read once per pass, and the
   rows of a step are split across threads.  Written with GCC's vector types (16 floats), which the compiler maps to
   AVX-512 or to pairs of AVX2 registers; T is float or bfloat16 bits, computed in float32. */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#include <omp.h>
__attribute__((__simd__("notinbranch"))) float expf(float);       /* glibc's libmvec holds the vector versions */

typedef float vf __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));
typedef float vf8 __attribute__((vector_size(32)));
#define AHEAD 16                                                   /* keys prefetched ahead of the one in use */

static inline vf ld_f32(const float *p) { vf x; memcpy(&x, p, 64); return x; }
/* two spots where GCC's generic lowering costs 10-15%: AVX-512's own */
#ifdef __AVX512F__
#include <immintrin.h>
static inline vf ld_bf16(const uint16_t *p) {
    return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
}
#else
static inline vf ld_bf16(const uint16_t *p) {                     /* bfloat16 is float32's top 16 bits */
    vh h; memcpy(&h, p, 32); vu u = __builtin_convertvector(h, vu) << 16; vf x; memcpy(&x, &u, 64); return x;
}
#endif
static inline void st_f32(float *p, vf x) { memcpy(p, &x, 64); }
static inline void st_bf16(uint16_t *p, vf x) {                   /* round to nearest even, as torch does */
    vu u; memcpy(&u, &x, 64); u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    vh h = __builtin_convertvector(u, vh); memcpy(p, &h, 32);
}
static inline float hsum(vf x) {
#ifdef __AVX512F__
    return _mm512_reduce_add_ps((__m512)x);
#endif
    vf8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7)
           + __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
    float s = 0.f;
    for (int i = 0; i < 8; i++) s += a[i];
    return s;
}
static inline void prefetch_row(const char *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}
static inline void prefetch_row_l2(const char *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
}
/* A thread's first row, or a part of one (fewer rows than threads), has no row before it to bring its window in, so
   it asks for the whole of it (bytes [off, off + bytes) of each held slot's K and V rows) into L2 before reading the
   first key. */
static inline void window_ahead(const void *k, const void *v, const int64_t *slots, int64_t held, int64_t row_bytes,
                                int64_t off, int64_t bytes) {
    for (int64_t t = 0; t < held; t++) {
        prefetch_row_l2((const char *)k + slots[t] * row_bytes + off, bytes);
        prefetch_row_l2((const char *)v + slots[t] * row_bytes + off, bytes);
    }
}

/* Sixteen vectors' sums as one vector: lane i of the result is the sum of the lanes of the i-th vector at p (a tree
   of 15 shuffle-and-adds, where sixteen horizontal sums would take some 60 operations). */
static inline vf sum16(const float *p) {
    vf x[16], y[8], z[4], w[2];
    for (int i = 0; i < 16; i++) x[i] = ld_f32(p + 16 * i);
    for (int i = 0; i < 8; i++)
        y[i] = __builtin_shufflevector(x[2*i], x[2*i+1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
             + __builtin_shufflevector(x[2*i], x[2*i+1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        z[i] = __builtin_shufflevector(y[2*i], y[2*i+1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
             + __builtin_shufflevector(y[2*i], y[2*i+1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        w[i] = __builtin_shufflevector(z[2*i], z[2*i+1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
             + __builtin_shufflevector(z[2*i], z[2*i+1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
         + __builtin_shufflevector(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
/* lanewise */
static inline vf vmax(vf a, vf b) {
    vu m = (vu)(b > a); vu r = ((vu)b & m) | ((vu)a & ~m); vf x; memcpy(&x, &r, 64); return x;
}

/* A head's softmax over its n scores, unnormalised: exp(s - max) in place, and 1 / their sum returned. One function,
   never inlined, so that every caller (a decode's row, a prefill chunk's rows) runs the same instructions and a
   token's weights have the same bits in each (the vectorised sum's order is the compiler's to choose, once). */
__attribute__((noinline)) static float softmax_(float *sg, int64_t n) {
    float m = -INFINITY, l = 0.f;
    int64_t t16 = n / 16 * 16;
    if (t16) {                                 /* the largest score, 16 lanes at a time */
        vf mv = ld_f32(sg);
        for (int64_t t = 16; t < t16; t += 16) mv = vmax(mv, ld_f32(sg + t));
        for (int i = 0; i < 16; i++) m = mv[i] > m ? mv[i] : m;
    }
    for (int64_t t = t16; t < n; t++) m = sg[t] > m ? sg[t] : m;
    _Pragma("omp simd reduction(+:l)")
    for (int64_t t = 0; t < n; t++) { float e = sg[t] - m; sg[t] = e < -80.f ? 0.f : expf(e); l += sg[t]; }
    return 1.f / l;      /* (below e^-80 a weight is 0: no denormals, slow and changing no bit of the sum) */
}

/* The next row's window, asked of the memory while this row computes: a cursor over its held
   keys' K rows, then their V rows, NEXT_LINES cache lines at every key of this row's loops (both passes, every
   head), into L2 (prefetcht1). This row runs 2 * KVH loops over its keys and the next row has about as many keys, so
   the whole next window is asked for in the first part of this row, some microseconds before it is read: far more
   lead than AHEAD keys, which could not cover the memory's latency with the block-sized jumps between a window's
   slots.  A pass reads a third of each slot row's lines (one KV head's), so the two prefetches overlap little.
   Nothing here changes a result, only when its bytes arrive.  A next row that holds no keys (its one key is new_k's,
   as in a warm-up) asks for nothing: its window may be empty, its slots a null pointer. */
#define NEXT_LINES 3
typedef struct { const char *k, *v, *pool; const int64_t *slots; int64_t n, j, line, lines, row_bytes; } ahead_t;
static inline void ahead_step(ahead_t *a) {
    if (!a) return;
    for (int i = 0; i < NEXT_LINES; i++) {
        /* K done: on to V, then nothing */
        if (a->j >= a->n) { if (a->pool == a->v || a->n <= 0) return; a->pool = a->v; a->j = 0; }
        __builtin_prefetch(a->pool + a->slots[a->j] * a->row_bytes + 64 * a->line, 0, 2);
        if (++a->line == a->lines) { a->line = 0; a->j++; }
    }
}

/* One row; D = 16 * NV.  A KV head at a time, and QB of its query heads at a time, so that their queries (for the
   scores) and their outputs (for the sum of V) stay in registers over the keys, each key's vectors loaded once per
   QB heads; every 16 keys, sum16 turns the QB x 16 partial dot products into scores.  part: QB * 16 * 16 floats, s:
   H * S floats (scratch).  next: the next row's cursor (ahead_t above), or 0 for a thread's last row.  NAME computes
   a whole row; NAME_part only its query heads ga..gb-1, so that fewer rows than threads can split a row's heads.
   Each head's arithmetic is its own, so the bits do not depend on the range; the body is one, inlined into both with
   `whole` a constant, so the whole row's loops compile as before. */
#define ROW(NAME, T, LD, ST, NV)                                                                                       \
static inline __attribute__((always_inline)) void NAME##_body(const T *q, const T *k, const T *v,                      \
        const int64_t *slots, int64_t n, const T *new_k, const T *new_v, T *out, int64_t H, int64_t KVH, float scale,  \
        float *part, float *s, int64_t S, ahead_t *next, int64_t ga, int64_t gb, const int whole) {                    \
    /* query heads at a time: QB * NV vectors of queries or of outputs */                                              \
    enum { QB = NV <= 4 ? 4 : NV <= 8 ? 2 : 1 };                                                                       \
    /* held: the keys the pool holds */                                                                                \
    int64_t G = H / KVH, KD = KVH * 16 * NV, held = new_k ? n - 1 : n;                                                 \
    const int64_t HEAD_BYTES = NV * 16 * (int64_t)sizeof(T);      /* a KV head's bytes of a slot row */                \
    /* a part: its KV heads' columns of the window, before the first is read */                                        \
    if (!whole)                                                                                                        \
        window_ahead(k, v, slots, held, KD * (int64_t)sizeof(T), ga / G * NV * 16 * (int64_t)sizeof(T),                \
                     ((gb - 1) / G - ga / G + 1) * NV * 16 * (int64_t)sizeof(T));                                      \
    /* scores: the KV heads of query heads ga..gb-1 */                                                                 \
    for (int64_t h = whole ? 0 : ga / G; whole ? h < KVH : h * G < gb; h++)                                            \
        for (int64_t lo = whole || h * G > ga ? h * G : ga, hi = whole || (h + 1) * G < gb ? (h + 1) * G : gb,         \
                     g0 = lo; g0 < hi; g0 += QB) {                                                                     \
            int64_t gn = hi - g0 < QB ? hi - g0 : QB;                                                                  \
            vf qv[QB][NV];                                                                                             \
            for (int b = 0; b < QB; b++) for (int j = 0; j < NV; j++)                                                  \
                qv[b][j] = b < gn ? LD(q + ((g0 + b) * NV + j) * 16) * scale : (vf){0};                                \
            for (int64_t t = 0; t < n; t++) {                                                                          \
                const T *row = (new_k && t == n - 1 ? new_k : k + slots[t] * KD) + h * NV * 16;                        \
                ahead_step(next);                                                                                      \
                /* this head's K and V of the key AHEAD on */                                                          \
                if (g0 == lo && t + AHEAD < held) {                                                                    \
                    const char *pk = (const char *)(k + slots[t + AHEAD] * KD + h * NV * 16),                          \
                               *pv = (const char *)(v + slots[t + AHEAD] * KD + h * NV * 16);                          \
                    if (whole) { prefetch_row(pk, HEAD_BYTES); prefetch_row(pv, HEAD_BYTES); }                         \
                    /* a part's, into L2 as well */                                                                    \
                    else { prefetch_row_l2(pk, HEAD_BYTES); prefetch_row_l2(pv, HEAD_BYTES); }                         \
                }                                                                                                      \
                vf x[NV];                                                                                              \
                for (int j = 0; j < NV; j++) x[j] = LD(row + j * 16);                                                  \
                for (int b = 0; b < QB; b++) if (b < gn) {                                                             \
                    vf d = qv[b][0] * x[0];                                                                            \
                    for (int j = 1; j < NV; j++) d += qv[b][j] * x[j];                                                 \
                    st_f32(part + (b * 16 + (t & 15)) * 16, d);                                                        \
                }                                                                                                      \
                /* 16 keys' partial sums: their scores */                                                              \
                if ((t & 15) == 15)                                                                                    \
                    for (int b = 0; b < gn; b++) st_f32(s + (g0 + b) * S + t - 15, sum16(part + b * 256));             \
            }                                                                                                          \
            /* the last n % 16 keys one at a time */                                                                   \
            for (int64_t t = n / 16 * 16; t < n; t++)                                                                  \
                for (int b = 0; b < gn; b++) s[(g0 + b) * S + t] = hsum(ld_f32(part + (b * 16 + (t & 15)) * 16));      \
        }                                                                                                              \
    float inv[H];                                                                                                      \
    for (int64_t g = whole ? 0 : ga; g < (whole ? H : gb); g++) inv[g] = softmax_(s + g * S, n);                      \
    /* the weighted sum of V */                                                                                        \
    for (int64_t h = whole ? 0 : ga / G; whole ? h < KVH : h * G < gb; h++)                                            \
        for (int64_t lo = whole || h * G > ga ? h * G : ga, hi = whole || (h + 1) * G < gb ? (h + 1) * G : gb,         \
                     g0 = lo; g0 < hi; g0 += QB) {                                                                     \
            int64_t gn = hi - g0 < QB ? hi - g0 : QB;                                                                  \
            vf acc[QB][NV];                                                                                            \
            for (int b = 0; b < QB; b++) for (int j = 0; j < NV; j++) acc[b][j] = (vf){0};                             \
            for (int64_t t = 0; t < n; t++) {                                                                          \
                const T *row = (new_v && t == n - 1 ? new_v : v + slots[t] * KD) + h * NV * 16;                        \
                ahead_step(next);                                                                                      \
                vf x[NV];                                                                                              \
                for (int j = 0; j < NV; j++) x[j] = LD(row + j * 16);                                                  \
                for (int b = 0; b < QB; b++) if (b < gn) {                                                             \
                    float p = s[(g0 + b) * S + t];                                                                     \
                    for (int j = 0; j < NV; j++) acc[b][j] += p * x[j];                                                \
                }                                                                                                      \
            }                                                                                                          \
            for (int b = 0; b < gn; b++) for (int j = 0; j < NV; j++)                                                  \
                ST(out + ((g0 + b) * NV + j) * 16, acc[b][j] * inv[g0 + b]);                                           \
        }                                                                                                              \
}                                                                                                                      \
static void NAME(const T *q, const T *k, const T *v, const int64_t *slots, int64_t n, const T *new_k, const T *new_v,  \
                 T *out, int64_t H, int64_t KVH, float scale, float *part, float *s, int64_t S, ahead_t *next) {       \
    NAME##_body(q, k, v, slots, n, new_k, new_v, out, H, KVH, scale, part, s, S, next, 0, H, 1);                       \
}                                                                                                                      \
static void NAME##_part(const T *q, const T *k, const T *v, const int64_t *slots, int64_t n, const T *new_k,           \
                        const T *new_v, T *out, int64_t H, int64_t KVH, float scale, float *part, float *s, int64_t S, \
                        int64_t ga, int64_t gb) {                                                                      \
    NAME##_body(q, k, v, slots, n, new_k, new_v, out, H, KVH, scale, part, s, S, 0, ga, gb, 0);                        \
}
#define QT 8                     /* rows a block of ROWS_OF takes */
/* qt (up to QT) rows of one sequence, each a token over the keys at its positions: row i reads the first n[i] slots.
   Every row's arithmetic is the decode row's above, key by key and head by head (the same products, the same sum16
   and hsum, softmax_, the same sums of V in key order), so a prefill token's bits are those it gets as a decode. What
   changes is the loops' order: the keys go in groups of 16, each group's K (then V) vectors widened to float32 once
   into kx, and every row of the block takes the group from there with its own queries (or sums) in registers. part:
   QT * QB * 256 floats, s: QT * H * S. */
#define ROWS_OF(NAME, T, LD, ST, NV) \
static void NAME##_rows(const T *q, const T *k, const T *v, const int64_t *slots, const int64_t *n, int64_t qt, \
                        T *out, int64_t H, int64_t KVH, float scale, float *part, float *s, int64_t S) { \
    enum { QB = NV <= 4 ? 4 : NV <= 8 ? 2 : 1 }; \
    int64_t G = H / KVH, KD = KVH * 16 * NV, D = 16 * NV, most = 0; \
    vf kx[16][NV], qv[QB][NV], acc[QT][QB][NV]; \
    for (int64_t i = 0; i < qt; i++) most = n[i] > most ? n[i] : most; \
    for (int64_t h = 0; h < KVH; h++) \
        for (int64_t g0 = h * G; g0 < (h + 1) * G; g0 += QB) { \
            int64_t gn = (h + 1) * G - g0 < QB ? (h + 1) * G - g0 : QB; \
            for (int64_t t0 = 0; t0 < most; t0 += 16) { \
                int64_t t1 = t0 + 16 < most ? t0 + 16 : most; \
                for (int64_t t = t0; t < t1; t++) \
                    for (int j = 0; j < NV; j++) kx[t - t0][j] = LD(k + slots[t] * KD + h * D + j * 16); \
                for (int64_t i = 0; i < qt; i++) { \
                    if (t0 >= n[i]) continue; \
                    int64_t te = t1 < n[i] ? t1 : n[i]; \
                    float *pi = part + i * QB * 256; \
                    for (int b = 0; b < QB; b++) \
                        for (int j = 0; j < NV; j++) \
                            qv[b][j] = b < gn ? LD(q + i * H * D + ((g0 + b) * NV + j) * 16) * scale : (vf){0}; \
                    for (int64_t t = t0; t < te; t++) \
                        for (int b = 0; b < QB; b++) if (b < gn) { \
                            vf d = qv[b][0] * kx[t - t0][0]; \
                            for (int j = 1; j < NV; j++) d += qv[b][j] * kx[t - t0][j]; \
                            st_f32(pi + (b * 16 + (t & 15)) * 16, d); \
                        } \
                    if (te == t0 + 16) \
                        for (int b = 0; b < gn; b++) st_f32(s + (i * H + g0 + b) * S + t0, sum16(pi + b * 256)); \
                } \
            } \
            for (int64_t i = 0; i < qt; i++) \
                for (int64_t t = n[i] / 16 * 16; t < n[i]; t++) \
                    for (int b = 0; b < gn; b++) \
                        s[(i * H + g0 + b) * S + t] = hsum(ld_f32(part + i * QB * 256 + (b * 16 + (t & 15)) * 16)); \
        } \
    float inv[QT][H]; \
    for (int64_t i = 0; i < qt; i++) \
        for (int64_t g = 0; g < H; g++) inv[i][g] = softmax_(s + (i * H + g) * S, n[i]); \
    for (int64_t h = 0; h < KVH; h++) \
        for (int64_t g0 = h * G; g0 < (h + 1) * G; g0 += QB) { \
            int64_t gn = (h + 1) * G - g0 < QB ? (h + 1) * G - g0 : QB; \
            for (int64_t i = 0; i < qt; i++) \
                for (int b = 0; b < QB; b++) for (int j = 0; j < NV; j++) acc[i][b][j] = (vf){0}; \
            for (int64_t t0 = 0; t0 < most; t0 += 16) { \
                int64_t t1 = t0 + 16 < most ? t0 + 16 : most; \
                for (int64_t t = t0; t < t1; t++) \
                    for (int j = 0; j < NV; j++) kx[t - t0][j] = LD(v + slots[t] * KD + h * D + j * 16); \
                for (int64_t i = 0; i < qt; i++) { \
                    if (t0 >= n[i]) continue; \
                    int64_t te = t1 < n[i] ? t1 : n[i]; \
                    vf a[QB][NV]; \
                    for (int b = 0; b < QB; b++) for (int j = 0; j < NV; j++) a[b][j] = acc[i][b][j]; \
                    for (int64_t t = t0; t < te; t++) \
                        for (int b = 0; b < QB; b++) if (b < gn) { \
                            float p = s[(i * H + g0 + b) * S + t]; \
                            for (int j = 0; j < NV; j++) a[b][j] += p * kx[t - t0][j]; \
                        } \
                    for (int b = 0; b < QB; b++) for (int j = 0; j < NV; j++) acc[i][b][j] = a[b][j]; \
                } \
            } \
            for (int64_t i = 0; i < qt; i++) \
                for (int b = 0; b < gn; b++) \
                    for (int j = 0; j < NV; j++) \
                        ST(out + i * H * D + ((g0 + b) * NV + j) * 16, acc[i][b][j] * inv[i][g0 + b]); \
        } \
}

#define ROWS(T, LD, ST, SUFFIX) \
    ROW(row1_##SUFFIX, T, LD, ST, 1) ROW(row2_##SUFFIX, T, LD, ST, 2) ROW(row4_##SUFFIX, T, LD, ST, 4) \
    ROW(row5_##SUFFIX, T, LD, ST, 5) ROW(row6_##SUFFIX, T, LD, ST, 6) ROW(row8_##SUFFIX, T, LD, ST, 8) \
    ROW(row16_##SUFFIX, T, LD, ST, 16) \
    ROWS_OF(row1_##SUFFIX, T, LD, ST, 1) ROWS_OF(row2_##SUFFIX, T, LD, ST, 2) ROWS_OF(row4_##SUFFIX, T, LD, ST, 4) \
    ROWS_OF(row5_##SUFFIX, T, LD, ST, 5) ROWS_OF(row6_##SUFFIX, T, LD, ST, 6) ROWS_OF(row8_##SUFFIX, T, LD, ST, 8) \
    ROWS_OF(row16_##SUFFIX, T, LD, ST, 16)
ROWS(float, ld_f32, st_f32, f32)
ROWS(uint16_t, ld_bf16, st_bf16, bf16)

/* Every row of a step, split across nthreads, each a run of consecutive rows, so that a row can ask for the next
   one's window (its held keys: the last one is new_k's where that is given).  With fewer rows than threads (batch 1)
   the split is over (row, query head) pairs instead, each thread a run of them, so no thread waits idle while one
   computes a whole row; those runs ask for no next window.  Returns 2 for a head size it has no version for (the
   caller uses SDPA), 1 when out of memory. */
#define DECODE(NAME, T, SUFFIX)                                                                                        \
int NAME(const T *q, const T *k, const T *v, const int64_t *win, int64_t W, const int64_t *ctx, const T *new_k,        \
         const T *new_v, T *out, int64_t R, int64_t H, int64_t KVH, int64_t D, float scale, int nthreads) {            \
    typedef void (*row_fn)(const T *, const T *, const T *, const int64_t *, int64_t, const T *, const T *, T *,       \
                           int64_t, int64_t, float, float *, float *, int64_t, ahead_t *);                             \
    typedef void (*part_fn)(const T *, const T *, const T *, const int64_t *, int64_t, const T *, const T *, T *,      \
                            int64_t, int64_t, float, float *, float *, int64_t, int64_t, int64_t);                     \
    row_fn f = D == 16 ? row1_##SUFFIX : D == 32 ? row2_##SUFFIX : D == 64 ? row4_##SUFFIX : D == 80 ? row5_##SUFFIX : \
               D == 96 ? row6_##SUFFIX : D == 128 ? row8_##SUFFIX : D == 256 ? row16_##SUFFIX : 0;                     \
    part_fn fp = D == 16 ? row1_##SUFFIX##_part : D == 32 ? row2_##SUFFIX##_part : D == 64 ? row4_##SUFFIX##_part :    \
                 D == 80 ? row5_##SUFFIX##_part : D == 96 ? row6_##SUFFIX##_part : D == 128 ? row8_##SUFFIX##_part :   \
                 D == 256 ? row16_##SUFFIX##_part : 0;                                                                 \
    if (!f || H % KVH) return 2;                                                                                       \
    int64_t S = 1, KD = KVH * D;                                                                                       \
    for (int64_t r = 0; r < R; r++) S = ctx[r] > S ? ctx[r] : S;                                                       \
    S = (S + 15) / 16 * 16;                                                                                            \
    int64_t per = 1024 + H * S;                                                                                        \
    float *scratch = malloc(sizeof(float) * per * (nthreads < 1 ? 1 : nthreads));                                      \
    if (!scratch) return 1;                                                                                            \
    _Pragma("omp parallel num_threads(nthreads)")                                                                      \
    {                                                                                                                  \
        int t = omp_get_thread_num(), nt = omp_get_num_threads();                                                      \
        float *own = scratch + t * per;                                                                                \
        /* fewer rows than threads: runs of (row, head) pairs */                                                       \
        if (R < nt)                                                                                                    \
            for (int64_t u = R * H * t / nt, end = R * H * (t + 1) / nt; u < end; ) {                                  \
                int64_t r = u / H, ga = u % H, gb = H < ga + end - u ? H : ga + end - u;                               \
                fp(q + r * H * D, k, v, win + r * W, ctx[r], new_k ? new_k + r * KD : 0, new_v ? new_v + r * KD : 0,   \
                   out + r * H * D, H, KVH, scale, own, own + 1024, S, ga, gb);                                        \
                u += gb - ga;                                                                                          \
            }                                                                                                          \
        else for (int64_t r = R * t / nt; r < R * (t + 1) / nt; r++) {                                                 \
            /* the thread's first row: its whole window, as its later rows get theirs */                               \
            if (r == R * t / nt)                                                                                       \
                window_ahead(k, v, win + r * W, ctx[r] - (new_k != 0), KD * (int64_t)sizeof(T), 0,                     \
                             KD * (int64_t)sizeof(T));                                                                 \
            ahead_t a = {(const char *)k, (const char *)v, (const char *)k, win + (r + 1) * W,                         \
                         r + 1 < R ? ctx[r + 1] - (new_k != 0) : 0, 0, 0, (KD * (int64_t)sizeof(T) + 63) / 64,         \
                         KD * (int64_t)sizeof(T)};                                                                     \
            f(q + r * H * D, k, v, win + r * W, ctx[r], new_k ? new_k + r * KD : 0, new_v ? new_v + r * KD : 0,        \
              out + r * H * D, H, KVH, scale, own, own + 1024, S, r + 1 < R * (t + 1) / nt ? &a : 0);                  \
        }                                                                                                              \
    }                                                                                                                  \
    free(scratch);                                                                                                     \
    return 0;                                                                                                          \
}
DECODE(decode_attention_f32, float, f32)
DECODE(decode_attention_bf16, uint16_t, bf16)

/* A prefill chunk's R tokens of one sequence, whose slots are win, each attending as a decode row of its own with
   ctx[r] keys (its position + 1): DECODE's bits for that row, computed QT rows at a time (ROWS_OF). The blocks go to
   the threads in turn, as a later token has more keys. Returns 2 for a head size it has no version for, 1 when out of
   memory. */
#define TOKENS(NAME, T, SUFFIX) \
int NAME(const T *q, const T *k, const T *v, const int64_t *win, const int64_t *ctx, T *out, int64_t R, int64_t H, \
         int64_t KVH, int64_t D, float scale, int nthreads) { \
    typedef void (*rows_fn)(const T *, const T *, const T *, const int64_t *, const int64_t *, int64_t, T *, int64_t, \
                            int64_t, float, float *, float *, int64_t); \
    rows_fn f = D == 16 ? row1_##SUFFIX##_rows : D == 32 ? row2_##SUFFIX##_rows : D == 64 ? row4_##SUFFIX##_rows : \
                D == 80 ? row5_##SUFFIX##_rows : D == 96 ? row6_##SUFFIX##_rows : D == 128 ? row8_##SUFFIX##_rows : \
                D == 256 ? row16_##SUFFIX##_rows : 0; \
    if (!f || H % KVH) return 2; \
    int64_t S = 1; \
    for (int64_t r = 0; r < R; r++) S = ctx[r] > S ? ctx[r] : S; \
    S = (S + 15) / 16 * 16; \
    int64_t per = QT * (1024 + H * S), blocks = (R + QT - 1) / QT; \
    float *scratch = malloc(sizeof(float) * per * (nthreads < 1 ? 1 : nthreads)); \
    if (!scratch) return 1; \
    _Pragma("omp parallel num_threads(nthreads)") \
    { \
        int t = omp_get_thread_num(), nt = omp_get_num_threads(); \
        float *own = scratch + t * per; \
        for (int64_t b = t; b < blocks; b += nt) { \
            int64_t r = b * QT, qt = R - r < QT ? R - r : QT; \
            f(q + r * H * D, k, v, win, ctx + r, qt, out + r * H * D, H, KVH, scale, own, own + QT * 1024, S); \
        } \
    } \
    free(scratch); \
    return 0; \
}
TOKENS(token_attention_f32, float, f32)
TOKENS(token_attention_bf16, uint16_t, bf16)
