/* elementwise.c: the decoder's small operators (RMSNorm, the rotary embedding, SiLU-times-up) in C.

   Computes  the layers' RMSNorm, rotary embedding (in place) and silu(gate) * up, in bfloat16 with PyTorch's eager
             roundings (its bits) and in float32 (to an ulp or so where a sum's order or the exponential differs).
   Entry     rms_norm_bf16, rope_bf16, silu_mul_bf16, rms_norm_f32, rope_f32, silu_mul_f32 (rope_* return 1 for a
             position outside the table).
   Build     ELEMENTWISE_FLAGS in nanoserve/elementwise.py: -O3 -march=native -ffp-contract=off -fno-math-errno
             -fno-trapping-math -fopenmp-simd, linked with -lmvec -lm (elementwise_kernel); nbs/06_elementwise.ipynb
             also builds it with -march=haswell.
   Checked   nbs/06_elementwise.ipynb, "The kernels" and "The layers": each operator against the layers' PyTorch
             operators; tests/test_fast.py::test_small_ops_greedy_text_equals_pytorch_operators. */

/* The decoder's small operators in bfloat16 and in float32, each one pass over its rows, rounding where PyTorch's
   eager operators round. GCC's vector types, 16 floats wide (AVX-512, or two AVX2 registers); -ffp-contract=off
   keeps a*b-c*d two roundings, not an FMA. */
#include <stdint.h>
#include <string.h>
#include <math.h>
__attribute__((__simd__("notinbranch"))) float expf(float);       /* glibc's libmvec holds the vector versions */

typedef float vf __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));

static inline vf ld(const uint16_t *p) {
    vh h; memcpy(&h, p, 32); vu u = __builtin_convertvector(h, vu) << 16; vf x; memcpy(&x, &u, 64); return x;
}
static inline vf ldf(const float *p) { vf x; memcpy(&x, p, 64); return x; }
static inline vf round_bf16(vf x) {                 /* to the nearest bfloat16, ties to even, kept as float32 */
    vu u; memcpy(&u, &x, 64); u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; vf y; memcpy(&y, &u, 64); return y;
}
static inline void st(uint16_t *p, vf x) {
    vu u; memcpy(&u, &x, 64); u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    vh h = __builtin_convertvector(u, vh); memcpy(p, &h, 32);
}
static inline float ld1(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline float rb1(float f) {
    uint32_t u; memcpy(&u, &f, 4); u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; memcpy(&f, &u, 4); return f;
}
static inline uint16_t st1(float f) {
    uint32_t u; memcpy(&u, &f, 4); return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The layers' RMSNorm: out = w * bf16(x * rsqrt(mean(x^2) + eps)).  n a multiple of 16; rows `ld` elements apart. */
void rms_norm_bf16(const uint16_t *x, int64_t ldx, const uint16_t *w, uint16_t *out, int64_t rows, int64_t n,
                   float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * ldx;
        vf acc = {0};
        for (int64_t i = 0; i < n; i += 16) { vf v = ld(xr + i); acc += v * v; }
        float s = 0.f;
        for (int i = 0; i < 16; i++) s += acc[i];
        float k = 1.f / sqrtf(s / (float)n + eps);
        for (int64_t i = 0; i < n; i += 16) st(out + r * n + i, ld(w + i) * round_bf16(ld(xr + i) * k));
    }
}

/* The layers' rotary embedding, in place: each head's halves (x1, x2) become (x1 c - x2 s, x2 c + x1 s), c and s the
   position's cos and sin rounded to bfloat16, every product and sum rounded as eager bfloat16 rounds them.  x
   [tokens][heads][D], rows ldx apart.  Returns 1, having written nothing, if a position is outside the table's
   max_pos. */
int rope_bf16(uint16_t *x, int64_t ldx, const int64_t *pos, const float *cos, const float *sin, int64_t max_pos,
              int64_t tokens, int64_t heads, int64_t D) {
    int64_t half = D / 2, v = half / 16 * 16;
    for (int64_t t = 0; t < tokens; t++) if (pos[t] < 0 || pos[t] >= max_pos) return 1;
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + pos[t] * half, *s = sin + pos[t] * half;
        for (int64_t h = 0; h < heads; h++) {
            uint16_t *x1 = x + t * ldx + h * D, *x2 = x1 + half;
            for (int64_t i = 0; i < v; i += 16) {
                vf a = ld(x1 + i), b = ld(x2 + i), cc = round_bf16(ldf(c + i)), ss = round_bf16(ldf(s + i));
                st(x1 + i, round_bf16(a * cc) - round_bf16(b * ss));
                st(x2 + i, round_bf16(b * cc) + round_bf16(a * ss));
            }
            for (int64_t i = v; i < half; i++) {
                float a = ld1(x1[i]), b = ld1(x2[i]), cc = rb1(c[i]), ss = rb1(s[i]);
                x1[i] = st1(rb1(a * cc) - rb1(b * ss)); x2[i] = st1(rb1(b * cc) + rb1(a * ss));
            }
        }
    }
    return 0;
}

/* The layers' MLP between its products: out = bf16(silu(gate)) * up, gate and up side by side in gu's rows
   ([rows][2 I]). */
void silu_mul_bf16(const uint16_t *gu, uint16_t *out, int64_t rows, int64_t I) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *g = gu + r * 2 * I, *u = g + I;
        uint16_t *o = out + r * I;
        #pragma omp simd
        for (int64_t i = 0; i < I; i++) {
            float x = ld1(g[i]);
            o[i] = st1(ld1(st1(x / (1.f + expf(-x)))) * ld1(u[i]));
        }
    }
}
/* float32: the same three operators, every product and sum rounded where the layers' float32 code rounds it, but for
   two things: RMSNorm's sum of squares runs in sixteen lanes (PyTorch's reduction has its own order), and SiLU's
   exponential is glibc's (PyTorch's is SLEEF's), each within an ulp or so of the other. */
void rms_norm_f32(const float *x, int64_t ldx, const float *w, float *out, int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        vf acc = {0};
        for (int64_t i = 0; i < n; i += 16) { vf v = ldf(xr + i); acc += v * v; }
        float s = 0.f;
        for (int i = 0; i < 16; i++) s += acc[i];
        float k = 1.f / sqrtf(s / (float)n + eps);
        for (int64_t i = 0; i < n; i += 16) { vf o = ldf(w + i) * (ldf(xr + i) * k); memcpy(out + r * n + i, &o, 64); }
    }
}

int rope_f32(float *x, int64_t ldx, const int64_t *pos, const float *cos, const float *sin, int64_t max_pos,
             int64_t tokens, int64_t heads, int64_t D) {
    int64_t half = D / 2;
    for (int64_t t = 0; t < tokens; t++) if (pos[t] < 0 || pos[t] >= max_pos) return 1;
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + pos[t] * half, *s = sin + pos[t] * half;
        for (int64_t h = 0; h < heads; h++) {
            float *x1 = x + t * ldx + h * D, *x2 = x1 + half;
            #pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = x1[i], b = x2[i];
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
    }
    return 0;
}

void silu_mul_f32(const float *gu, float *out, int64_t rows, int64_t I) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * I, *u = g + I;
        float *o = out + r * I;
        #pragma omp simd
        for (int64_t i = 0; i < I; i++) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
    }
}
