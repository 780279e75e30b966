/* Day 12's decode-attention kernel as the speed issue's fifth pass left it (kept for bench/decode_attention.py's `kernel-5th-pass`
   arm): every key's row read once for all its KV heads, the query heads' dot products summed one key at a time, the outputs
   accumulated in memory, a scalar maximum; built as it was then, without -ffp-contract=fast. */
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

/* One row; D = 16 * NV.  qf, acc: H * D floats, s: H * S floats (scratch). */
#define ROW(NAME, T, LD, ST, NV)                                                                                               \
static void NAME(const T *q, const T *k, const T *v, const int64_t *slots, int64_t n, const T *new_k, const T *new_v, T *out,  \
                 int64_t H, int64_t KVH, float scale, float *qf, float *acc, float *s, int64_t S) {                            \
    int64_t G = H / KVH, KD = KVH * 16 * NV;                                                                                   \
    for (int64_t i = 0; i < H * NV; i++) st_f32(qf + 16 * i, LD(q + 16 * i) * scale);                                          \
    for (int64_t t = 0; t < n; t++) {              /* scores */                                                               \
        const T *row = new_k && t == n - 1 ? new_k : k + slots[t] * KD;                                                        \
        if (t + AHEAD < n) prefetch_row((const char *)(k + slots[t + AHEAD] * KD), KD * sizeof(T));                            \
        for (int64_t h = 0; h < KVH; h++) {                                                                                    \
            vf x[NV];                                                                                                          \
            for (int j = 0; j < NV; j++) x[j] = LD(row + (h * NV + j) * 16);                                                   \
            for (int64_t g = h * G; g < (h + 1) * G; g++) {                                                                    \
                vf d = ld_f32(qf + g * NV * 16) * x[0];                                                                        \
                for (int j = 1; j < NV; j++) d += ld_f32(qf + (g * NV + j) * 16) * x[j];                                       \
                s[g * S + t] = hsum(d);                                                                                        \
            }                                                                                                                  \
        }                                                                                                                      \
    }                                                                                                                          \
    float inv[H];                                                                                                              \
    for (int64_t g = 0; g < H; g++) {              /* softmax, unnormalised: exp(s - max) and its sum */                      \
        float *sg = s + g * S, m = -INFINITY, l = 0.f;                                                                         \
        for (int64_t t = 0; t < n; t++) m = sg[t] > m ? sg[t] : m;                                                             \
        _Pragma("omp simd reduction(+:l)")                                                                                     \
        for (int64_t t = 0; t < n; t++) { float e = sg[t] - m; sg[t] = e < -80.f ? 0.f : expf(e); l += sg[t]; }               \
        inv[g] = 1.f / l;           /* (below e^-80 a weight is 0: no denormals, which would be slow and change no bit of the sum) */ \
    }                                                                                                                          \
    memset(acc, 0, sizeof(float) * H * NV * 16);                                                                               \
    for (int64_t t = 0; t < n; t++) {              /* the weighted sum of V */                                                \
        const T *row = new_v && t == n - 1 ? new_v : v + slots[t] * KD;                                                        \
        if (t + AHEAD < n) prefetch_row((const char *)(v + slots[t + AHEAD] * KD), KD * sizeof(T));                            \
        for (int64_t h = 0; h < KVH; h++) {                                                                                    \
            vf x[NV];                                                                                                          \
            for (int j = 0; j < NV; j++) x[j] = LD(row + (h * NV + j) * 16);                                                   \
            for (int64_t g = h * G; g < (h + 1) * G; g++) {                                                                    \
                float p = s[g * S + t]; float *a = acc + g * NV * 16;                                                          \
                for (int j = 0; j < NV; j++) st_f32(a + 16 * j, ld_f32(a + 16 * j) + p * x[j]);                                \
            }                                                                                                                  \
        }                                                                                                                      \
    }                                                                                                                          \
    for (int64_t i = 0; i < H * NV; i++) ST(out + 16 * i, ld_f32(acc + 16 * i) * inv[i / NV]);                                 \
}
#define ROWS(T, LD, ST, SUFFIX) ROW(row1_##SUFFIX, T, LD, ST, 1) ROW(row2_##SUFFIX, T, LD, ST, 2) ROW(row4_##SUFFIX, T, LD, ST, 4) \
    ROW(row5_##SUFFIX, T, LD, ST, 5) ROW(row6_##SUFFIX, T, LD, ST, 6) ROW(row8_##SUFFIX, T, LD, ST, 8) ROW(row16_##SUFFIX, T, LD, ST, 16)
ROWS(float, ld_f32, st_f32, f32)
ROWS(uint16_t, ld_bf16, st_bf16, bf16)

/* Every row of a step, split across nthreads.  Returns 2 for a head size it has no version for (the caller uses SDPA), 1 when out of memory. */
#define DECODE(NAME, T, SUFFIX)                                                                                                \
int NAME(const T *q, const T *k, const T *v, const int64_t *win, int64_t W, const int64_t *ctx, const T *new_k, const T *new_v, \
         T *out, int64_t R, int64_t H, int64_t KVH, int64_t D, float scale, int nthreads) {                                    \
    typedef void (*row_fn)(const T *, const T *, const T *, const int64_t *, int64_t, const T *, const T *, T *, int64_t, int64_t, float, float *, float *, float *, int64_t); \
    row_fn f = D == 16 ? row1_##SUFFIX : D == 32 ? row2_##SUFFIX : D == 64 ? row4_##SUFFIX : D == 80 ? row5_##SUFFIX :        \
               D == 96 ? row6_##SUFFIX : D == 128 ? row8_##SUFFIX : D == 256 ? row16_##SUFFIX : 0;                             \
    if (!f || H % KVH) return 2;                                                                                               \
    int64_t S = 1, KD = KVH * D;                                                                                               \
    for (int64_t r = 0; r < R; r++) S = ctx[r] > S ? ctx[r] : S;                                                               \
    S = (S + 15) / 16 * 16;                                                                                                    \
    int64_t per = 2 * H * D + H * S;                                                                                           \
    float *scratch = malloc(sizeof(float) * per * (nthreads < 1 ? 1 : nthreads));                                             \
    if (!scratch) return 1;                                                                                                    \
    _Pragma("omp parallel for num_threads(nthreads) schedule(static)")                                                         \
    for (int64_t r = 0; r < R; r++) {                                                                                          \
        float *own = scratch + omp_get_thread_num() * per;                                                                     \
        f(q + r * H * D, k, v, win + r * W, ctx[r], new_k ? new_k + r * KD : 0, new_v ? new_v + r * KD : 0, out + r * H * D,   \
          H, KVH, scale, own, own + H * D, own + 2 * H * D, S);                                                                \
    }                                                                                                                          \
    free(scratch);                                                                                                             \
    return 0;                                                                                                                  \
}
DECODE(decode_attention_f32, float, f32)
DECODE(decode_attention_bf16, uint16_t, bf16)
