
/* Decode attention read straight from the paged pool.  Row r's H query heads (G = H / KVH to a KV head) attend to its first
   ctx[r] slots of win (its window); each slot's row, every KV head of it, is read once per pass, and the rows of a step are
   split across threads.  Written with GCC's vector types (16 floats), which the compiler maps to AVX-512 or to pairs of AVX2
   registers; T is float or bfloat16 bits, computed in float32. */
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
#ifdef __AVX512F__                                                /* two spots where GCC's generic lowering costs 10-15%: AVX-512's own */
#include <immintrin.h>
static inline vf ld_bf16(const uint16_t *p) { return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16); }
#else
static inline vf ld_bf16(const uint16_t *p) {                     /* bfloat16 is float32's top 16 bits */
    vh h; memcpy(&h, p, 32); vu u = __builtin_convertvector(h, vu) << 16; vf x; memcpy(&x, &u, 64); return x;
}
#endif
static inline void st_f32(float *p, vf x) { memcpy(p, &x, 64); }
static inline void st_bf16(uint16_t *p, vf x) {                   /* round to nearest even, as torch does */
    vu u; memcpy(&u, &x, 64); u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; vh h = __builtin_convertvector(u, vh); memcpy(p, &h, 32);
}
static inline float hsum(vf x) {
#ifdef __AVX512F__
    return _mm512_reduce_add_ps((__m512)x);
#endif
    vf8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
    float s = 0.f;
    for (int i = 0; i < 8; i++) s += a[i];
    return s;
}
static inline void prefetch_row(const char *p, int64_t bytes) { for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b); }

/* Sixteen vectors' sums as one vector: lane i of the result is the sum of the lanes of the i-th vector at p (a tree of 15
   shuffle-and-adds, where sixteen horizontal sums would take some 60 operations). */
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
static inline vf vmax(vf a, vf b) { vu m = (vu)(b > a); vu r = ((vu)b & m) | ((vu)a & ~m); vf x; memcpy(&x, &r, 64); return x; }   /* lanewise */

/* The next row's window, asked of the memory while this row computes (the fifteenth pass): a cursor over its held keys' K rows,
   then their V rows, NEXT_LINES cache lines at every key of this row's loops (both passes, every head), into L2 (prefetcht1).
   This row runs 2 * KVH loops over its keys and the next row has about as many keys, so the whole next window is asked for in
   the first part of this row, some microseconds before it is read: far more lead than AHEAD keys, which could not cover the
   memory's latency with the block-sized jumps between a window's slots.  A pass reads a third of each slot row's lines (one KV
   head's), so the two prefetches overlap little.  Nothing here changes a result, only when its bytes arrive.  A next row that
   holds no keys (its one key is new_k's, as in a warm-up) asks for nothing: its window may be empty, its slots a null pointer. */
#define NEXT_LINES 3
typedef struct { const char *k, *v, *pool; const int64_t *slots; int64_t n, j, line, lines, row_bytes; } ahead_t;
static inline void ahead_step(ahead_t *a) {
    if (!a) return;
    for (int i = 0; i < NEXT_LINES; i++) {
        if (a->j >= a->n) { if (a->pool == a->v || a->n <= 0) return; a->pool = a->v; a->j = 0; }   /* K done: on to V, then nothing */
        __builtin_prefetch(a->pool + a->slots[a->j] * a->row_bytes + 64 * a->line, 0, 2);
        if (++a->line == a->lines) { a->line = 0; a->j++; }
    }
}

/* One row; D = 16 * NV.  A KV head at a time, and QB of its query heads at a time, so that their queries (for the scores) and
   their outputs (for the sum of V) stay in registers over the keys, each key's vectors loaded once per QB heads; every 16 keys,
   sum16 turns the QB x 16 partial dot products into scores.  part: QB * 16 * 16 floats, s: H * S floats (scratch).  next: the
   next row's cursor (ahead_t above), or 0 for a thread's last row. */
#define ROW(NAME, T, LD, ST, NV)                                                                                                      \
static void NAME(const T *q, const T *k, const T *v, const int64_t *slots, int64_t n, const T *new_k, const T *new_v, T *out,         \
                 int64_t H, int64_t KVH, float scale, float *part, float *s, int64_t S, ahead_t *next) {                              \
    enum { QB = NV <= 4 ? 4 : NV <= 8 ? 2 : 1 };   /* query heads at a time: QB * NV vectors of queries or of outputs */              \
    int64_t G = H / KVH, KD = KVH * 16 * NV, held = new_k ? n - 1 : n;     /* held: the keys the pool holds */                        \
    for (int64_t h = 0; h < KVH; h++)              /* scores */                                                                       \
        for (int64_t g0 = h * G; g0 < (h + 1) * G; g0 += QB) {                                                                        \
            int64_t gn = (h + 1) * G - g0 < QB ? (h + 1) * G - g0 : QB;                                                               \
            vf qv[QB][NV];                                                                                                            \
            for (int b = 0; b < QB; b++) for (int j = 0; j < NV; j++)                                                                 \
                qv[b][j] = b < gn ? LD(q + ((g0 + b) * NV + j) * 16) * scale : (vf){0};                                               \
            for (int64_t t = 0; t < n; t++) {                                                                                         \
                const T *row = (new_k && t == n - 1 ? new_k : k + slots[t] * KD) + h * NV * 16;                                       \
                ahead_step(next);                                                                                                     \
                if (g0 == h * G && t + AHEAD < held) {     /* this head's K and V of the key AHEAD on */                              \
                    prefetch_row((const char *)(k + slots[t + AHEAD] * KD + h * NV * 16), NV * 32);                                   \
                    prefetch_row((const char *)(v + slots[t + AHEAD] * KD + h * NV * 16), NV * 32);                                   \
                }                                                                                                                     \
                vf x[NV];                                                                                                             \
                for (int j = 0; j < NV; j++) x[j] = LD(row + j * 16);                                                                 \
                for (int b = 0; b < QB; b++) if (b < gn) {                                                                            \
                    vf d = qv[b][0] * x[0];                                                                                           \
                    for (int j = 1; j < NV; j++) d += qv[b][j] * x[j];                                                                \
                    st_f32(part + (b * 16 + (t & 15)) * 16, d);                                                                       \
                }                                                                                                                     \
                if ((t & 15) == 15)                        /* 16 keys' partial sums: their scores */                                  \
                    for (int b = 0; b < gn; b++) st_f32(s + (g0 + b) * S + t - 15, sum16(part + b * 256));                            \
            }                                                                                                                         \
            for (int64_t t = n / 16 * 16; t < n; t++)      /* the last n % 16 keys one at a time */                                   \
                for (int b = 0; b < gn; b++) s[(g0 + b) * S + t] = hsum(ld_f32(part + (b * 16 + (t & 15)) * 16));                     \
        }                                                                                                                             \
    float inv[H];                                                                                                                     \
    for (int64_t g = 0; g < H; g++) {              /* softmax, unnormalised: exp(s - max) and its sum */                              \
        float *sg = s + g * S, m = -INFINITY, l = 0.f;                                                                                \
        int64_t t16 = n / 16 * 16;                                                                                                    \
        if (t16) {                                 /* the largest score, 16 lanes at a time */                                        \
            vf mv = ld_f32(sg);                                                                                                       \
            for (int64_t t = 16; t < t16; t += 16) mv = vmax(mv, ld_f32(sg + t));                                                     \
            for (int i = 0; i < 16; i++) m = mv[i] > m ? mv[i] : m;                                                                   \
        }                                                                                                                             \
        for (int64_t t = t16; t < n; t++) m = sg[t] > m ? sg[t] : m;                                                                  \
        _Pragma("omp simd reduction(+:l)")                                                                                            \
        for (int64_t t = 0; t < n; t++) { float e = sg[t] - m; sg[t] = e < -80.f ? 0.f : expf(e); l += sg[t]; }                       \
        inv[g] = 1.f / l;           /* (below e^-80 a weight is 0: no denormals, which would be slow and change no bit of the sum) */ \
    }                                                                                                                                 \
    for (int64_t h = 0; h < KVH; h++)              /* the weighted sum of V */                                                        \
        for (int64_t g0 = h * G; g0 < (h + 1) * G; g0 += QB) {                                                                        \
            int64_t gn = (h + 1) * G - g0 < QB ? (h + 1) * G - g0 : QB;                                                               \
            vf acc[QB][NV];                                                                                                           \
            for (int b = 0; b < QB; b++) for (int j = 0; j < NV; j++) acc[b][j] = (vf){0};                                            \
            for (int64_t t = 0; t < n; t++) {                                                                                         \
                const T *row = (new_v && t == n - 1 ? new_v : v + slots[t] * KD) + h * NV * 16;                                       \
                ahead_step(next);                                                                                                     \
                vf x[NV];                                                                                                             \
                for (int j = 0; j < NV; j++) x[j] = LD(row + j * 16);                                                                 \
                for (int b = 0; b < QB; b++) if (b < gn) {                                                                            \
                    float p = s[(g0 + b) * S + t];                                                                                    \
                    for (int j = 0; j < NV; j++) acc[b][j] += p * x[j];                                                               \
                }                                                                                                                     \
            }                                                                                                                         \
            for (int b = 0; b < gn; b++) for (int j = 0; j < NV; j++)                                                                 \
                ST(out + ((g0 + b) * NV + j) * 16, acc[b][j] * inv[g0 + b]);                                                          \
        }                                                                                                                             \
}
#define ROWS(T, LD, ST, SUFFIX) ROW(row1_##SUFFIX, T, LD, ST, 1) ROW(row2_##SUFFIX, T, LD, ST, 2) ROW(row4_##SUFFIX, T, LD, ST, 4) \
    ROW(row5_##SUFFIX, T, LD, ST, 5) ROW(row6_##SUFFIX, T, LD, ST, 6) ROW(row8_##SUFFIX, T, LD, ST, 8) ROW(row16_##SUFFIX, T, LD, ST, 16)
ROWS(float, ld_f32, st_f32, f32)
ROWS(uint16_t, ld_bf16, st_bf16, bf16)

/* Every row of a step, split across nthreads, each a run of consecutive rows, so that a row can ask for the next one's window
   (its held keys: the last one is new_k's where that is given).  Returns 2 for a head size it has no version for (the caller
   uses SDPA), 1 when out of memory. */
#define DECODE(NAME, T, SUFFIX)                                                                                                \
int NAME(const T *q, const T *k, const T *v, const int64_t *win, int64_t W, const int64_t *ctx, const T *new_k, const T *new_v, \
         T *out, int64_t R, int64_t H, int64_t KVH, int64_t D, float scale, int nthreads) {                                    \
    typedef void (*row_fn)(const T *, const T *, const T *, const int64_t *, int64_t, const T *, const T *, T *, int64_t, int64_t, float, float *, float *, int64_t, ahead_t *); \
    row_fn f = D == 16 ? row1_##SUFFIX : D == 32 ? row2_##SUFFIX : D == 64 ? row4_##SUFFIX : D == 80 ? row5_##SUFFIX :        \
               D == 96 ? row6_##SUFFIX : D == 128 ? row8_##SUFFIX : D == 256 ? row16_##SUFFIX : 0;                             \
    if (!f || H % KVH) return 2;                                                                                               \
    int64_t S = 1, KD = KVH * D;                                                                                               \
    for (int64_t r = 0; r < R; r++) S = ctx[r] > S ? ctx[r] : S;                                                               \
    S = (S + 15) / 16 * 16;                                                                                                    \
    int64_t per = 1024 + H * S;                                                                                                \
    float *scratch = malloc(sizeof(float) * per * (nthreads < 1 ? 1 : nthreads));                                             \
    if (!scratch) return 1;                                                                                                    \
    _Pragma("omp parallel num_threads(nthreads)")                                                                              \
    {                                                                                                                          \
        int t = omp_get_thread_num(), nt = omp_get_num_threads();                                                              \
        float *own = scratch + t * per;                                                                                        \
        for (int64_t r = R * t / nt; r < R * (t + 1) / nt; r++) {                                                              \
            ahead_t a = {(const char *)k, (const char *)v, (const char *)k, win + (r + 1) * W,                                 \
                         r + 1 < R ? ctx[r + 1] - (new_k != 0) : 0, 0, 0, (KD * (int64_t)sizeof(T) + 63) / 64, KD * (int64_t)sizeof(T)}; \
            f(q + r * H * D, k, v, win + r * W, ctx[r], new_k ? new_k + r * KD : 0, new_v ? new_v + r * KD : 0, out + r * H * D, \
              H, KVH, scale, own, own + 1024, S, r + 1 < R * (t + 1) / nt ? &a : 0);                                           \
        }                                                                                                                      \
    }                                                                                                                          \
    free(scratch);                                                                                                             \
    return 0;                                                                                                                  \
}
DECODE(decode_attention_f32, float, f32)
DECODE(decode_attention_bf16, uint16_t, bf16)
