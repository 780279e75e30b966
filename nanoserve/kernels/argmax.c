/* argmax.c: the batched argmax of logit rows, the greedy token of every plain greedy row in one call.

   Computes  out[r] = the first index of row r's largest value, as torch.argmax gives it, or -1 for a row that holds
             a NaN (the caller hands those rows to torch, which ranks NaN above everything).
   Entry     argmax_f32(x, rows, n, out) and argmax_bf16(...) over float32 or bfloat16 rows [rows, n] (bfloat16 read as
             it is, not widened into a copy).
   Build     one: -O3 -march=native -fPIC -shared -std=c11 (nanoserve/sampling.py, argmax_kernel).
   Checked   nbs/14_sampling.ipynb, "The batched argmax, in C": rows_argmax against torch.argmax on ties, infinities
             and NaN; tests/test_fast.py::test_decode_call_argmax_serves_greedy_rows_not_grammar_rows. */

#include <stdint.h>
#include <string.h>
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(64)));

/* Each row's argmax as torch.argmax finds it: the first index of the row's largest value.  A row holding a NaN gets
   -1 (torch's answer there is the first NaN; the caller asks torch).  Sixteen lanes each keep their first largest
   value and its index; the row's answer is the smallest index among the lanes that hold the largest of them, then
   the tail, scalar. */
static inline vf ld_f32(const float *p) { vf y; memcpy(&y, p, 64); return y; }
/* bfloat16 is float32's top 16 bits: widened exactly */
static inline vf ld_bf16(const uint16_t *p) {
    vh h; memcpy(&h, p, 32); vu u = __builtin_convertvector(h, vu) << 16; vf y; memcpy(&y, &u, 64); return y;
}
static inline float one_f32(float x) { return x; }
static inline float one_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
/* float32 rows (every LM head's logits, the decode call's included), or bfloat16 rows as their float32 values (no
   widened copy) */
#define ARGMAX(NAME, T, LD, ONE)                                                                                       \
void NAME(const T *x, int64_t rows, int64_t n, int64_t *out) {                                                         \
    for (int64_t r = 0; r < rows; r++) {                                                                               \
        const T *p = x + r * n;                                                                                        \
        int64_t v = n / 16 * 16, best_i = 0;                                                                           \
        float best = ONE(p[0]);                                                                                        \
        int nan = 0;                                                                                                   \
        if (v) {                                                                                                       \
            vf b, y; vi bi, idx, step = {16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16}, bad = {0};   \
            for (int i = 0; i < 16; i++) idx[i] = i;                                                                   \
            b = LD(p); bi = idx; bad |= b != b;                                                                        \
            for (int64_t i = 16; i < v; i += 16) {                                                                     \
                idx += step; y = LD(p + i);                                                                            \
                /* strictly larger: a lane keeps its first maximum */                                                  \
                vi m = y > b;                                                                                          \
                b = (vf)(((vi)y & m) | ((vi)b & ~m)); bi = (idx & m) | (bi & ~m); bad |= y != y;                       \
            }                                                                                                          \
            for (int i = 0; i < 16; i++) nan |= bad[i] != 0;                                                           \
            best = b[0]; best_i = bi[0];                                                                               \
            for (int i = 1; i < 16; i++)                                                                               \
                if (b[i] > best || (b[i] == best && bi[i] < best_i)) { best = b[i]; best_i = bi[i]; }                  \
        }                                                                                                              \
        for (int64_t i = v; i < n; i++) {                                                                              \
            float e = ONE(p[i]);                                                                                       \
            if (e != e) nan = 1;                                                                                       \
            if (e > best) { best = e; best_i = i; }                                                                    \
        }                                                                                                              \
        out[r] = nan ? -1 : best_i;                                                                                    \
    }                                                                                                                  \
}
ARGMAX(argmax_f32, float, ld_f32, one_f32)
ARGMAX(argmax_bf16, uint16_t, ld_bf16, one_bf16)
