/* peak.c: the CPU's arithmetic peak, one product instruction at a time, the way the memory's rate is measured.

   Computes  nothing of use: `iters` rounds of one product instruction over independent accumulators held in registers
             (or AMX's tiles), on each of nthreads threads, so that only the instruction's throughput limits the rate.
   Entry     peak_run(kind, iters, nthreads, checksum): kind 0 float32 FMA on AVX-512, 1 float32 FMA on AVX2, 2
             vdpbf16ps (AVX512-BF16), 3 vpdpbusd (AVX512-VNNI, int8), 4 tdpbf16ps (AMX-BF16), 5 tdpbssd (AMX-INT8);
             writes a checksum of the accumulators (so the compiler keeps the work); returns 0, 1 for a kind it does
             not know, 2 where Linux refuses AMX's tile state.
             peak_ops(kind): the arithmetic operations (a multiply and an add are two) one instruction does.
   Build     PEAK_FLAGS in nanoserve/prefill_bench.py: -O3 -fopenmp -fPIC -shared -std=c11; each kind's instructions by
             a target attribute, whatever -march, so one build holds every kind and Python asks only for those the CPU
             flags name (peak_kinds).
   Checked   nbs/65_prefill_bench.ipynb, "The arithmetic peak": every kind the CPU has runs and gives a rate, and each
             kind's operations per round; tests/test_prefill_bench.py through `nanoserve bench prefill`. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <immintrin.h>
#include <omp.h>
#include <unistd.h>
#include <sys/syscall.h>

#define ACC 12                       /* chains: an FMA's latency (4 cycles) times its two ports, and some to spare */

__attribute__((target("avx512f"))) static double fma512(int64_t iters) {
    __m512 a[ACC], x = _mm512_set1_ps(0.5f), y = _mm512_set1_ps(0.5f);
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t n = 0; n < iters; n++)
        for (int i = 0; i < ACC; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);          /* a -> a / 2 + 1 / 2: no growth */
    __m512 s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static double fma256(int64_t iters) {
    __m256 a[ACC], x = _mm256_set1_ps(0.5f), y = _mm256_set1_ps(0.5f);
    for (int i = 0; i < ACC; i++) a[i] = _mm256_set1_ps((float)i);
    for (int64_t n = 0; n < iters; n++)
        for (int i = 0; i < ACC; i++) a[i] = _mm256_fmadd_ps(a[i], x, y);
    float out[8];
    __m256 s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm256_add_ps(s, a[i]);
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

__attribute__((target("avx512f,avx512bf16"))) static double dpbf16(int64_t iters) {
    __m512 a[ACC];
    /* bfloat16 pairs of 2^-10: each instruction adds 2^-19 to a lane, far from rounding away or overflowing */
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3a80), y = (__m512bh)_mm512_set1_epi16(0x3a80);
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t n = 0; n < iters; n++)
        for (int i = 0; i < ACC; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) static double dpbusd(int64_t iters) {
    __m512i a[ACC], x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(1);          /* int32 lanes wrap; no matter */
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_epi32(i);
    for (int64_t n = 0; n < iters; n++)
        for (int i = 0; i < ACC; i++) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
    __m512i s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_epi32(s, a[i]);
    return (double)_mm512_reduce_add_epi32(s);
}

typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg;

/* Four accumulator tiles (16 x 16 float32 or int32), two A tiles and two B tiles of 16 rows x 64 bytes: every
   instruction a full tile, as a 2 x 2 block of a product's output is computed. */
__attribute__((target("amx-tile"))) static void tiles_on(void) {
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile,amx-bf16"))) static double amx_bf16(int64_t iters) {
    static const uint16_t ab[16 * 32] = {0};                                   /* zeros: the rate is the same */
    float c[16 * 16];
    tiles_on();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, ab, 64); _tile_loadd(5, ab, 64); _tile_loadd(6, ab, 64); _tile_loadd(7, ab, 64);
    for (int64_t n = 0; n < iters; n++) {
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    _tile_release();
    return c[0];
}

__attribute__((target("amx-tile,amx-int8"))) static double amx_int8(int64_t iters) {
    static const int8_t ab[16 * 64] = {0};
    int32_t c[16 * 16];
    tiles_on();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, ab, 64); _tile_loadd(5, ab, 64); _tile_loadd(6, ab, 64); _tile_loadd(7, ab, 64);
    for (int64_t n = 0; n < iters; n++) {
        _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    _tile_release();
    return c[0];
}

/* operations per round of each kind: ACC vector instructions (lanes x 2, x 2 pairs, x 4 bytes), or 4 tile products
   (16 x 16 outputs x 32 pairs or 64 bytes, x 2) */
int64_t peak_ops(int kind) {
    static const int64_t ops[] = {ACC * 16 * 2, ACC * 8 * 2, ACC * 16 * 2 * 2, ACC * 16 * 4 * 2,
                                  4 * 16 * 16 * 32 * 2, 4 * 16 * 16 * 64 * 2};
    return kind >= 0 && kind < 6 ? ops[kind] : 0;
}

int peak_run(int kind, int64_t iters, int nthreads, double *checksum) {
    if (kind < 0 || kind > 5) return 1;
    if (kind >= 4 && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */)) return 2;
    double sum = 0;
    _Pragma("omp parallel num_threads(nthreads) reduction(+:sum)")
    {
        switch (kind) {
            case 0: sum += fma512(iters); break;
            case 1: sum += fma256(iters); break;
            case 2: sum += dpbf16(iters); break;
            case 3: sum += dpbusd(iters); break;
            case 4: sum += amx_bf16(iters); break;
            default: sum += amx_int8(iters); break;
        }
    }
    *checksum = sum;
    return 0;
}
