/* lora.c: each row's LoRA delta added to a product's output, rows of several adapters in one call.

   Computes  y[r, seg] += s * (x[r] A_g^T) B_g^T for every row r whose adapter slot is slot[r] >= 0, for each output
             segment g of the product the adapter targets (q, k and v of a fused q/k/v product; gate and up of a fused
             gate/up product; one segment otherwise), s the slot's scale; rows of slot -1 are left as they are.
   Order     every row's sums in one fixed order, whatever rows share the call: x . A's rows in four sums of sixteen
             float32 lanes, summed pairwise, then the rank's products in order; so a row's bits never depend on its batch (the
             batch-invariant mode).  Rows are grouped by slot only so that an adapter's weights are read once a call.
   Entry     lora_add(p, x, y, R, slot, es, nthreads): x [R, K] and y [R, N] in bfloat16 (es 2; y rounded once, to
             nearest even) or float32 (es 4).
   Build     -O3 -march=native -mprefer-vector-width=512 -ffp-contract=fast -fopenmp -fPIC -shared -std=c11
             (nanoserve/lora_batch.py, lora_kernel): fused multiply-adds, the same ones for every row.
   Checked   nbs/06_lora_batch.ipynb, "The kernel": against lora_delta in float32, a row alone and in a crowd bit for
             bit; tests/test_lora.py against PEFT's merged model. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One product's adapters.  table [S, width] (int64), a row per slot: [0] the address of A, the adapter's A matrices
   of this product's segments stacked ([ra, K], in the product's dtype; 0: no adapter on this product in that slot),
   [1] ra, then for each segment g: [2 + 3g] its first row in A, [3 + 3g] its rank (0: not targeted), [4 + 3g] the
   address of its B transposed in chunks of CHUNK outputs ([ceil(width / CHUNK), rank, CHUNK], zero past the width:
   a chunk's rank rows are one contiguous run, read as one stream).  segs [G, 2]: each segment's first output and
   width. */
typedef struct {
    int64_t K, N, G, S, width;
    const int64_t *segs, *table;
    const float *scale;
} lora_product;

static inline float f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
/* to nearest, ties to even, as PyTorch rounds; a NaN stays a NaN (written without a branch, so a loop of it is
   vectorised) */
static inline uint16_t bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}
/* sixteen float32 lanes, one AVX-512 register (two AVX2 ones): the sums below are written in them, so the compiler
   keeps them in registers and their order is the source's */
typedef float vf __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));
static inline vf ld(const float *p) { vf v; memcpy(&v, p, 64); return v; }
static inline void st(float *p, vf v) { memcpy(p, &v, 64); }
/* sixteen bfloat16 widened (exactly), and sixteen float32 rounded to bfloat16 as bf16() rounds each */
static inline vf ld_bf16(const uint16_t *p) {
    vh h; memcpy(&h, p, 32);
    vu u = __builtin_convertvector(h, vu) << 16;
    vf f; memcpy(&f, &u, 64); return f;
}
static inline void st_bf16(uint16_t *p, vf f) {
    vu u; memcpy(&u, &f, 64);
    vu r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    vu nan = (vu)((u & 0x7fffffffu) > 0x7f800000u);
    r = (r & ~nan) | (0x7fc0u & nan);
    vh h = __builtin_convertvector(r, vh);
    memcpy(p, &h, 32);
}
static void widen(const void *x, float *out, int64_t n, int64_t es) {
    if (es == 4) { memcpy(out, x, 4 * n); return; }
    const uint16_t *p = x;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) st(out + i, ld_bf16(p + i));
    for (; i < n; i++) out[i] = f32(p[i]);
}

#define CHUNK 64
/* the end of a dot product: its four vector sums added (0 + 1) + (2 + 3), the sixteen lanes summed pairwise, then
   the tail from k on, scalar */
static float finish(vf s0, vf s1, vf s2, vf s3, const float *a, const float *b, int64_t k, int64_t K) {
    float l[16];
    st(l, (s0 + s1) + (s2 + s3));
    for (int w = 8; w; w /= 2)
        for (int i = 0; i < w; i++) l[i] += l[i + w];
    float sum = l[0];
    for (; k < K; k++) sum += a[k] * b[k];
    return sum;
}
/* a . b in one order: four sums of sixteen lanes along K (64 products a step, four chains in flight), added
   (0 + 1) + (2 + 3), the sixteen lanes summed pairwise, then the tail */
static float dot(const float *a, const float *b, int64_t K) {
    vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        s0 += ld(a + k) * ld(b + k);
        s1 += ld(a + k + 16) * ld(b + k + 16);
        s2 += ld(a + k + 32) * ld(b + k + 32);
        s3 += ld(a + k + 48) * ld(b + k + 48);
    }
    for (; k + 16 <= K; k += 16) s0 += ld(a + k) * ld(b + k);
    return finish(s0, s1, s2, s3, a, b, k, K);
}

/* `dot` of four rows x[q] with one b at once, each row's sums exactly `dot`'s (the same products, in the same
   order): b's vectors are read once for the four rows */
static void dot4(const float *const *x, const float *b, int64_t K, float *out) {
    vf s[4][4] = {{{0}}};
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        vf b0 = ld(b + k), b1 = ld(b + k + 16), b2 = ld(b + k + 32), b3 = ld(b + k + 48);
        for (int q = 0; q < 4; q++) {
            s[q][0] += ld(x[q] + k) * b0;
            s[q][1] += ld(x[q] + k + 16) * b1;
            s[q][2] += ld(x[q] + k + 32) * b2;
            s[q][3] += ld(x[q] + k + 48) * b3;
        }
    }
    int64_t k16 = k;
    for (int q = 0; q < 4; q++) {
        vf s0 = s[q][0];
        for (k = k16; k + 16 <= K; k += 16) s0 += ld(x[q] + k) * ld(b + k);
        out[q] = finish(s0, s[q][1], s[q][2], s[q][3], x[q], b, k, K);
    }
}

/* what one call shares with its work items: the rows ordered by slot, their widened inputs and their sums h */
typedef struct {
    const lora_product *p;
    const int64_t *order, *start;
    float *xf, *h;
    int64_t HR, es;
    void *y;
} call;

/* h[r, j] = x[r] . A[j] for each row r of slot s: A's row j widened once into buf, dotted with each row */
static void a_item(const call *c, int64_t s, int64_t j, float *buf) {
    const lora_product *p = c->p;
    int64_t K = p->K, n = c->start[s + 1] - c->start[s], i = 0;
    const int64_t *rows = c->order + c->start[s];
    const char *A = (const char *)(intptr_t)p->table[s * p->width];
    if (j + 2 < p->table[s * p->width + 1])                        /* row j + 2 asked for now, as in b_item */
        for (int64_t b = 0; b < c->es * K; b += 64) __builtin_prefetch(A + c->es * (j + 2) * K + b);
    widen(A + c->es * j * K, buf, K, c->es);
    for (; i + 4 <= n; i += 4) {
        const float *x[4];
        float out[4];
        for (int q = 0; q < 4; q++) x[q] = c->xf + rows[i + q] * K;
        dot4(x, buf, K, out);
        for (int q = 0; q < 4; q++) c->h[rows[i + q] * c->HR + j] = out[q];
    }
    for (; i < n; i++) c->h[rows[i] * c->HR + j] = dot(c->xf + rows[i] * K, buf, K);
}

/* y[r, off + o] += scale * sum_j B^T[j, o] h[r, j0 + j] for outputs o of chunk c0 of segment g, each row r of slot s:
   B^T's chunk (contiguous) widened once into buf; the rows two at a time (eight sums in flight), the same sums per row */
static void b_item(const call *c, int64_t s, int64_t g, int64_t c0, float *buf) {
    const lora_product *p = c->p;
    const int64_t *t = p->table + s * p->width, *rows = c->order + c->start[s];
    int64_t off = p->segs[2 * g], wd = p->segs[2 * g + 1], j0 = t[2 + 3 * g], rk = t[3 + 3 * g], es = c->es;
    int64_t cw = wd - c0 < CHUNK ? wd - c0 : CHUNK, n = c->start[s + 1] - c->start[s], N = p->N;
    const char *Bt = (const char *)(intptr_t)t[4 + 3 * g];
    float sc = p->scale[s];
    /* the chunks two and three ahead asked for now (one contiguous run each): memory's latency is hidden behind this
       chunk's sums rather than paid at the next chunk's first read */
    for (int64_t ahead = 2; ahead <= 3; ahead++)
        if (c0 + ahead * CHUNK < wd)
            for (int64_t b = 0; b < es * rk * CHUNK; b += 64) __builtin_prefetch(Bt + es * (c0 + ahead * CHUNK) * rk + b);
    widen(Bt + es * c0 * rk, buf, rk * CHUNK, es);                   /* chunk c0 / CHUNK: rk rows of CHUNK */
    for (int64_t i = 0; i < n; i += 2) {
        int64_t two = i + 1 < n, r0 = rows[i], r1 = rows[i + two];
        const float *h0 = c->h + r0 * c->HR + j0, *h1 = c->h + r1 * c->HR + j0;
        vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        for (int64_t j = 0; j < rk; j++) {
            const float *b = buf + j * CHUNK;
            vf v0 = ld(b), v1 = ld(b + 16), v2 = ld(b + 32), v3 = ld(b + 48);
            a0 += v0 * h0[j];
            a1 += v1 * h0[j];
            a2 += v2 * h0[j];
            a3 += v3 * h0[j];
            b0 += v0 * h1[j];
            b1 += v1 * h1[j];
            b2 += v2 * h1[j];
            b3 += v3 * h1[j];
        }
        vf sums[2][4] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}};
        for (int64_t q = 0; q <= two; q++) {
            int64_t r = q ? r1 : r0;
            if (cw == CHUNK && es == 2) {                              /* a whole chunk: sixteen lanes at a time */
                uint16_t *yr = (uint16_t *)c->y + r * N + off + c0;
                for (int v = 0; v < 4; v++) st_bf16(yr + 16 * v, ld_bf16(yr + 16 * v) + sc * sums[q][v]);
                continue;
            }
            if (cw == CHUNK) {
                float *yr = (float *)c->y + r * N + off + c0;
                for (int v = 0; v < 4; v++) st(yr + 16 * v, ld(yr + 16 * v) + sc * sums[q][v]);
                continue;
            }
            float acc[CHUNK];
            for (int v = 0; v < 4; v++) st(acc + 16 * v, sums[q][v]);
            if (es == 2) {
                uint16_t *yr = (uint16_t *)c->y + r * N + off + c0;
                for (int64_t o = 0; o < cw; o++) acc[o] = f32(yr[o]) + sc * acc[o];
                for (int64_t o = 0; o < cw; o++) yr[o] = bf16(acc[o]);
            } else {
                float *yr = (float *)c->y + r * N + off + c0;
                for (int64_t o = 0; o < cw; o++) yr[o] = yr[o] + sc * acc[o];
            }
        }
    }
}

/* a whole slot by one thread: its rows widened, its A rows, its chunks */
static void slot_whole(const call *c, const void *x, int64_t s, float *buf) {
    const lora_product *p = c->p;
    const int64_t *t = p->table + s * p->width;
    for (int64_t i = c->start[s]; i < c->start[s + 1]; i++)
        widen((const char *)x + c->es * c->order[i] * p->K, c->xf + c->order[i] * p->K, p->K, c->es);
    for (int64_t j = 0; j < t[1]; j++) a_item(c, s, j, buf);
    for (int64_t g = 0; g < p->G; g++)
        for (int64_t c0 = 0; t[3 + 3 * g] && c0 < p->segs[2 * g + 1]; c0 += CHUNK) b_item(c, s, g, c0, buf);
}

/* Returns 0; 1 out of memory; 2 a slot outside the table (before anything is written).  One parallel region.  With
   at least as many slots in the call as threads, each slot is one thread's whole (no thread waits for another
   mid-call); with fewer (batch 1), each slot's work is shared: the rows widened, then its A rows (one work item
   each), then its chunks of outputs.  Either way each output is one item's, summed in one order. */
int lora_add(const lora_product *p, const void *x, void *y, int64_t R, const int64_t *slot, int64_t es,
             int nthreads) {
    int64_t K = p->K, S = p->S, W = p->width, HR = 0, any = 0, RK = 0;
    for (int64_t r = 0; r < R; r++) {
        if (slot[r] >= S) return 2;
        if (slot[r] >= 0 && p->table[slot[r] * W]) any = 1;
    }
    if (!any) return 0;
    for (int64_t s = 0; s < S; s++) {
        if (p->table[s * W + 1] > HR) HR = p->table[s * W + 1];
        for (int64_t g = 0; g < p->G; g++) if (p->table[s * W + 3 + 3 * g] > RK) RK = p->table[s * W + 3 + 3 * g];
    }
    /* rows ordered by slot (a counting sort); the slots in the call and the work items of the shared stages */
    int64_t nB = 0;
    for (int64_t g = 0; g < p->G; g++) nB += (p->segs[2 * g + 1] + CHUNK - 1) / CHUNK;
    int64_t *order = malloc(8 * (R + 3 * (S + 1) + 2 * S * HR + 3 * S * nB));
    float *xf = malloc(4 * R * K), *h = malloc(4 * R * HR);
    if (!order || !xf || !h) { free(order); free(xf); free(h); return 1; }
    int64_t *start = order + R, *fill = start + S + 1, *live = fill + S + 1, *itemA = live + S + 1;
    int64_t *itemB = itemA + 2 * S * HR;
    memset(start, 0, 8 * (S + 1));
    for (int64_t r = 0; r < R; r++) if (slot[r] >= 0) start[slot[r] + 1]++;
    for (int64_t s = 0; s < S; s++) start[s + 1] += start[s];
    memcpy(fill, start, 8 * (S + 1));
    for (int64_t r = 0; r < R; r++) if (slot[r] >= 0) order[fill[slot[r]]++] = r;
    int64_t nA = 0, nb = 0, nl = 0;
    for (int64_t s = 0; s < S; s++) {
        const int64_t *t = p->table + s * W;
        if (start[s + 1] == start[s] || !t[0]) continue;
        live[nl++] = s;
        for (int64_t j = 0; j < t[1]; j++) { itemA[2 * nA] = s; itemA[2 * nA + 1] = j; nA++; }
        for (int64_t g = 0; g < p->G; g++)
            for (int64_t c = 0; t[3 + 3 * g] && c < p->segs[2 * g + 1]; c += CHUNK) {
                itemB[3 * nb] = s; itemB[3 * nb + 1] = g; itemB[3 * nb + 2] = c; nb++;
            }
    }
    call c = {p, order, start, xf, h, HR, es, y};
    int rc = 0, whole = nl >= nthreads;
    #pragma omp parallel num_threads(nthreads)
    {
        float *buf = malloc(4 * (K > RK * CHUNK ? K : RK * CHUNK));
        if (!buf) rc = 1;
        if (whole) {
            #pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < nl; i++) if (buf) slot_whole(&c, x, live[i], buf);
        } else {
            #pragma omp for
            for (int64_t i = 0; i < start[S]; i++)
                widen((const char *)x + es * order[i] * K, xf + order[i] * K, K, es);
            #pragma omp for
            for (int64_t w = 0; w < nA; w++) if (buf) a_item(&c, itemA[2 * w], itemA[2 * w + 1], buf);
            #pragma omp for
            for (int64_t w = 0; w < nb; w++) if (buf) b_item(&c, itemB[3 * w], itemB[3 * w + 1], itemB[3 * w + 2], buf);
        }
        free(buf);
    }
    free(order); free(xf); free(h);
    return rc;
}
