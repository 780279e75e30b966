/* Day 12's decode-attention kernel as the speed issue's third pass left it (commit e4b59ec): one thread, loops over a head size
   known at run time.  Kept for bench/decode_attention.py's comparison with today's kernel; not used by the engine. */
/* Decode attention read straight from the paged pool: for each row r, its H query heads (G of them to a KV head) attend to
   the row's first ctx[r] slots of win (its window). Two passes over the slots: scores and their softmax, then the weighted sum
   of V. T is the element type (float or bfloat16 bits), computed in float32. */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
__attribute__((__simd__("notinbranch"))) float expf(float);       /* glibc's libmvec holds the vector versions */

static inline void row_f32(const float *src, float *dst, int64_t n) { memcpy(dst, src, sizeof(float) * n); }
static inline void row_bf16(const uint16_t *src, float *dst, int64_t n) {     /* bfloat16 is float32's top 16 bits */
    uint32_t *d = (uint32_t *)dst;
    for (int64_t i = 0; i < n; i++) d[i] = (uint32_t)src[i] << 16;
}
static inline void out_f32(float *dst, const float *src, int64_t n) { memcpy(dst, src, sizeof(float) * n); }
static inline void out_bf16(uint16_t *dst, const float *src, int64_t n) {     /* round to nearest even, as torch does */
    for (int64_t i = 0; i < n; i++) { uint32_t u; memcpy(&u, &src[i], 4); u += 0x7fffu + ((u >> 16) & 1u); dst[i] = (uint16_t)(u >> 16); }
}

#define DECODE_ATTENTION(NAME, T, LOAD, STORE)                                                                               \
int NAME(const T *q, const T *k, const T *v, const int64_t *win, int64_t W, const int64_t *ctx, const T *new_k, const T *new_v, \
         T *out, int64_t R, int64_t H, int64_t KVH, int64_t D, float scale)                                                  \
{                                                                                                                            \
    int64_t G = H / KVH, KD = KVH * D, S = 1;                                                                                \
    for (int64_t r = 0; r < R; r++) S = ctx[r] > S ? ctx[r] : S;                                                             \
    float *s = malloc(sizeof(float) * H * S), *qf = malloc(sizeof(float) * H * D), *acc = malloc(sizeof(float) * H * D),    \
          *row = malloc(sizeof(float) * KD), *sum = malloc(sizeof(float) * H);                                               \
    if (!s || !qf || !acc || !row || !sum) { free(s); free(qf); free(acc); free(row); free(sum); return 1; }                \
    for (int64_t r = 0; r < R; r++) {                                                                                        \
        int64_t n = ctx[r];                                                                                                  \
        const int64_t *slots = win + r * W;                                                                                  \
        LOAD(q + r * H * D, qf, H * D);                                                                                      \
        for (int64_t i = 0; i < H * D; i++) qf[i] *= scale;                                                                  \
        for (int64_t t = 0; t < n; t++) {        /* scores: a key slot's row, every KV head, read once for all its queries */ \
            LOAD(new_k && t == n - 1 ? new_k + r * KD : k + slots[t] * KD, row, KD);   /* new_k: the last key, not in the pool */ \
            for (int64_t j = 0; j < H; j++) {                                                                                \
                const float *qj = qf + j * D, *kj = row + (j / G) * D; float dot = 0.f;                                      \
                for (int64_t d = 0; d < D; d++) dot += qj[d] * kj[d];                                                        \
                s[j * S + t] = dot;                                                                                          \
            }                                                                                                                \
        }                                                                                                                    \
        for (int64_t j = 0; j < H; j++) {        /* softmax, unnormalised: exp(s - max) and its sum */                      \
            float *sj = s + j * S, m = -INFINITY, l = 0.f;                                                                   \
            for (int64_t t = 0; t < n; t++) m = sj[t] > m ? sj[t] : m;                                                       \
            _Pragma("omp simd reduction(+:l)")                                                                               \
            for (int64_t t = 0; t < n; t++) { float x = sj[t] - m; sj[t] = x < -80.f ? 0.f : expf(x); l += sj[t]; }           \
            sum[j] = l;          /* (below e^-80 a weight is 0: no denormals, which would be slow and change no bit of the sum) */ \
        }                                                                                                                    \
        memset(acc, 0, sizeof(float) * H * D);                                                                               \
        for (int64_t t = 0; t < n; t++) {        /* the weighted sum of V, each slot's row read once */                     \
            LOAD(new_v && t == n - 1 ? new_v + r * KD : v + slots[t] * KD, row, KD);                                         \
            for (int64_t j = 0; j < H; j++) {                                                                                \
                float p = s[j * S + t], *a = acc + j * D; const float *vj = row + (j / G) * D;                               \
                for (int64_t d = 0; d < D; d++) a[d] += p * vj[d];                                                           \
            }                                                                                                                \
        }                                                                                                                    \
        for (int64_t j = 0; j < H; j++) { float inv = 1.f / sum[j]; for (int64_t d = 0; d < D; d++) acc[j * D + d] *= inv; } \
        STORE(out + r * H * D, acc, H * D);                                                                                  \
    }                                                                                                                        \
    free(s); free(qf); free(acc); free(row); free(sum);                                                                      \
    return 0;                                                                                                                \
}
DECODE_ATTENTION(decode_attention_f32, float, row_f32, out_f32)
DECODE_ATTENTION(decode_attention_bf16, uint16_t, row_bf16, out_bf16)
