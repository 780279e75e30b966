/* decode_call.c: a decode step's whole forward in one C call, through the other kernels' entry points.

   Computes  every decoder layer in order (RMSNorm, the q/k/v product, Qwen3's q/k norms where the layer has them,
             the rotary embedding, K/V into the pool, each product followed by its rows' LoRA deltas where adapters
             are loaded (lora.c's kernel, its address handed in),
             decode attention, the output product and residual, RMSNorm, gate/up, SiLU-times-up, down, residual),
             then the final norm and the LM head into float32 logits, in bfloat16 or float32 (a bfloat16 head
             writes its float32 sums unrounded).
   Entry     decode_forward (the rows' embeddings given) and decode_rows (token ids, cache rows and contexts given,
             slots and windows read from the slot table; optionally each row's argmax too).
   Build     DECODE_CALL_FLAGS in nanoserve/decode_call.py: -O3 -march=native -fPIC -shared -std=c11
             (decode_call_kernel); the kernels it calls are the other libraries', their addresses handed in.
   Checked   nbs/13_decode_call.ipynb, "Checks": the call's logits against the layers' forward, bit for bit;
             tests/test_fast.py::test_decode_call_gives_the_layers_tokens_and_logprobs. */

/* A decode step's whole forward in one call: every decoder layer's operators in order, through the product,
   small-operator and decode-attention kernels (their addresses handed in by Python), in one dtype throughout:
   bfloat16 (es = 2) or float32 (es = 4). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The kernels' signatures with their element pointers as void *: one table holds bfloat16's kernels or float32's,
   and es says which.  A bfloat16 product's last argument asks for its float32 sums unrounded (the LM head's). */
typedef int (*linear_fn)(const void *x, const void *w, const void *bias, void *out, int64_t M, int64_t N, int64_t K,
                         int nthreads, int f32);
typedef void (*linear_void_fn)(const void *x, const void *w, const void *bias, void *out, int64_t M, int64_t N,
                               int64_t K, int nthreads);
typedef void (*norm_fn)(const void *x, int64_t ldx, const void *w, void *out, int64_t rows, int64_t n, float eps);
typedef int (*rope_fn)(void *x, int64_t ldx, const int64_t *pos, const float *cos, const float *sin, int64_t max_pos,
                       int64_t tokens, int64_t heads, int64_t D);
typedef void (*silu_mul_fn)(const void *gu, void *out, int64_t rows, int64_t I);
/* the sampler's argmax: -1 for a row holding a NaN */
typedef void (*argmax_fn)(const void *x, int64_t rows, int64_t n, int64_t *out);
typedef int (*attend_fn)(const void *q, const void *k, const void *v, const int64_t *win, int64_t W, const int64_t *ctx,
                         const void *new_k, const void *new_v, void *out, int64_t R, int64_t H, int64_t KVH, int64_t D,
                         float scale, int nthreads);

/* lora.c's lora_add: each row's LoRA delta onto a product's output, over the product's adapter table p */
typedef int (*lora_fn)(const void *p, const void *x, void *y, int64_t R, const int64_t *slot, int64_t es,
                       int nthreads);

typedef struct {
    int64_t es;                      /* bytes per element: 2 bfloat16, 4 float32 */
    /* the bfloat16 kernel's product (either build), which says 1 when out of memory ... */
    linear_fn linear;
    linear_void_fn linear_void;      /* ... or float32's, which cannot fail: exactly one of the two is set */
    norm_fn norm; rope_fn rope; silu_mul_fn silu_mul; attend_fn attend;
    /* the int8 product over the decoder layers' int8 weights (bfloat16 only), or null: the layers' products are then
       `linear`'s, as the LM head's always are */
    linear_fn qlinear;
    lora_fn lora;                    /* the LoRA delta kernel, or null: no adapters */
} kernels;
/* one decoder layer: its norms' weights, its packed products and their biases (or null), its K/V pools; q_norm and
   k_norm: Qwen3's norms over each q head and each k head ([head_dim] weights), or null for a layer without them */
typedef struct {
    const void *input_norm, *qkv, *qkv_bias, *o, *o_bias, *post_norm, *gate_up, *gate_up_bias, *down, *down_bias;
    void *k_pool, *v_pool;
    const void *q_norm, *k_norm;
    /* each product's LoRA adapter table (lora.c's lora_product), or null: no adapter changes it */
    const void *lora_qkv, *lora_o, *lora_gate_up, *lora_down;
} layer;
typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, max_pos, num_slots;
    float eps, scale;
    const float *cos, *sin;                        /* the rotary tables, [max_pos, head_dim / 2] */
    const void *final_norm, *lm_head, *lm_head_bias;
    const layer *layer;
    int64_t head_quant;                            /* 1: the LM head is quantized like the layers (a draft model's) */
} model;

static inline float f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t bf16(float f) {             /* to nearest, ties to even, as PyTorch rounds; a NaN stays a NaN */
    uint32_t u; memcpy(&u, &f, 4);
    return f != f ? 0x7fc0 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* The residual sum x += y as eager PyTorch computes it: in bfloat16, widened, added and rounded; in float32, one
   IEEE addition. */
static void add_(const kernels *kn, void *x, const void *y, int64_t n) {
    if (kn->es == 2) {
        uint16_t *a = x; const uint16_t *b = y;
        for (int64_t i = 0; i < n; i++) a[i] = bf16(f32(a[i]) + f32(b[i]));
    }
    else { float *a = x; const float *b = y; for (int64_t i = 0; i < n; i++) a[i] = a[i] + b[i]; }
}
/* f32: a bfloat16 product writes float32 (the float32 kernel always does) */
static int product(const kernels *kn, const void *x, const void *w, const void *bias, void *out, int64_t M, int64_t N,
                   int64_t K, int nthreads, int f32) {
    if (kn->linear) return kn->linear(x, w, bias, out, M, N, K, nthreads, f32);
    kn->linear_void(x, w, bias, out, M, N, K, nthreads);
    return 0;
}
/* a decoder layer's product: the int8 kernel's where the layers are int8 */
static int layer_product(const kernels *kn, const void *x, const void *w, const void *bias, void *out, int64_t M,
                         int64_t N, int64_t K, int nthreads, int f32) {
    if (kn->qlinear) return kn->qlinear(x, w, bias, out, M, N, K, nthreads, f32);
    return product(kn, x, w, bias, out, M, N, K, nthreads, f32);
}
/* a product's LoRA deltas, where the product has an adapter table and the step names each row's adapter slot */
static int lora_(const kernels *kn, const void *p, const void *x, void *y, int64_t R, const int64_t *adapter,
                 int nthreads) {
    return p && adapter && kn->lora ? kn->lora(p, x, y, R, adapter, kn->es, nthreads) : 0;
}
static int out_of_bounds(const model *m, const int64_t *slot, const int64_t *win, int64_t W, const int64_t *ctx,
                         int64_t R) {
    for (int64_t r = 0; r < R; r++) {
        if (slot[r] < 0 || slot[r] >= m->num_slots || ctx[r] < 1 || ctx[r] > W) return 1;
        for (int64_t t = 0; t < ctx[r]; t++) if (win[r * W + t] < 0 || win[r * W + t] >= m->num_slots) return 1;
    }
    return 0;
}

/* h [R, hidden]: the rows' embeddings, overwritten by the residual stream, in the kernels' dtype; logits [R, vocab]
   out, float32.  Row r is at position pos[r], its K/V go to pool slot slot[r], and it attends to the first ctx[r]
   slots of its window win[r * W ...]; adapter[r] is its LoRA adapter's slot (-1: the base; adapter null: no row has
   one). Returns 0; 1 out of memory; 2 an adapter slot outside the tables; 3 a position outside the rotary table, 4 a
   slot outside the pool or a context outside the window (both before anything is written). */
int decode_forward(const kernels *kn, const model *m, void *h, const int64_t *pos, const int64_t *slot,
                   const int64_t *win, int64_t W, const int64_t *ctx, int64_t R, void *logits, int nthreads,
                   const int64_t *adapter) {
    if (out_of_bounds(m, slot, win, W, ctx, R)) return 4;
    int64_t es = kn->es, E = m->hidden, D = m->head_dim, QS = m->heads * D, KVS = m->kv_heads * D, QKV = QS + 2 * KVS,
            I = m->intermediate;
    /* char *: offsets below are in elements, times es */
    char *buf = malloc(es * R * (2 * E + QKV + 2 * QS + 3 * I));
    if (!buf) return 1;
    char *xn = buf, *qkv = xn + es * R * E, *q = qkv + es * R * QKV, *att = q + es * R * QS, *y = att + es * R * QS,
         *gu = y + es * R * E, *a = gu + es * R * 2 * I;
    int rc = 0;
    for (int64_t l = 0; l < m->layers; l++) {
        const layer *L = m->layer + l;
        kn->norm(h, E, L->input_norm, xn, R, E, m->eps);
        if ((rc = layer_product(kn, xn, L->qkv, L->qkv_bias, qkv, R, QKV, E, nthreads, 0))) break;
        if ((rc = lora_(kn, L->lora_qkv, xn, qkv, R, adapter, nthreads))) break;
        /* Qwen3: each q head and each k head normalised in place, a row of D each (the norm reads a row whole
           before it writes it, and writes it where it read it) */
        for (int64_t r = 0; L->q_norm && r < R; r++) {
            char *row = qkv + es * r * QKV;
            kn->norm(row, D, L->q_norm, row, m->heads, D, m->eps);
            kn->norm(row + es * QS, D, L->k_norm, row + es * QS, m->kv_heads, D, m->eps);
        }
        if (kn->rope(qkv, QKV, pos, m->cos, m->sin, m->max_pos, R, m->heads + m->kv_heads, D)) { rc = 3; break; }
        for (int64_t r = 0; r < R; r++) {
            const char *row = qkv + es * r * QKV;
            memcpy(q + es * r * QS, row, es * QS);
            memcpy((char *)L->k_pool + es * slot[r] * KVS, row + es * QS, es * KVS);
            memcpy((char *)L->v_pool + es * slot[r] * KVS, row + es * (QS + KVS), es * KVS);
        }
        rc = kn->attend(q, L->k_pool, L->v_pool, win, W, ctx, 0, 0, att, R, m->heads, m->kv_heads, D, m->scale,
                        nthreads);
        if (rc) break;
        if ((rc = layer_product(kn, att, L->o, L->o_bias, y, R, E, QS, nthreads, 0))) break;
        if ((rc = lora_(kn, L->lora_o, att, y, R, adapter, nthreads))) break;
        add_(kn, h, y, R * E);
        kn->norm(h, E, L->post_norm, xn, R, E, m->eps);
        if ((rc = layer_product(kn, xn, L->gate_up, L->gate_up_bias, gu, R, 2 * I, E, nthreads, 0))) break;
        if ((rc = lora_(kn, L->lora_gate_up, xn, gu, R, adapter, nthreads))) break;
        kn->silu_mul(gu, a, R, I);
        if ((rc = layer_product(kn, a, L->down, L->down_bias, y, R, E, I, nthreads, 0))) break;
        if ((rc = lora_(kn, L->lora_down, a, y, R, adapter, nthreads))) break;
        add_(kn, h, y, R * E);
    }
    if (!rc) {
        kn->norm(h, E, m->final_norm, xn, R, E, m->eps);
        /* the logits in float32, whatever the dtype: the head's sums are never rounded to bfloat16 */
        if (m->head_quant) rc = layer_product(kn, xn, m->lm_head, m->lm_head_bias, logits, R, m->vocab, E, nthreads, 1);
        else rc = product(kn, xn, m->lm_head, m->lm_head_bias, logits, R, m->vocab, E, nthreads, 1);
    }
    free(buf);
    return rc;
}

/* The same step given as the engine holds it: step row r is cache row rows[r], decoding token tok[r] as the last of
   its ctx[r] tokens.  Its position is ctx[r] - 1; its slot and its window are read from the cache's slot table
   (int32 [table_rows, ld], -1 where nothing is allocated), the window's padding past ctx[r] set to slot 0 (which
   nothing reads); its embedding is row tok[r] of `embed` [embed_rows, hidden] (block 0), or of a tied LM head's packed
   copy (embed_row).  So Python hands over three lists of
   integers and no tensors of its own.  With `argmax` (the sampler's float32 kernel, its address handed in: the logits
   are float32 in either dtype) each row's argmax goes to best[r] too; adapter: each row's LoRA slot, or null.  Returns decode_forward's codes, and 5 for a
   token, row or context outside its table (before anything is written). */
/* Row n of a [N, E] matrix into h (E elements of es bytes): from plain rows (block 0), or from the product kernels'
   packed layout: blocks of `block` rows (the last narrower: the rows rounded up to `pad`, less the whole blocks'),
   each [E / p][width][p], p = 2 for bfloat16's pairs and 1 for float32. */
static void embed_row(char *h, const char *t, int64_t n, int64_t N, int64_t E, int64_t es, int64_t block,
                      int64_t pad) {
    if (!block) {
        memcpy(h, t + es * n * E, es * E);
        return;
    }
    int64_t p = es == 2 ? 2 : 1, n0 = n / block * block, padded = (N + pad - 1) / pad * pad;
    int64_t width = padded - n0 < block ? padded - n0 : block;
    const char *col = t + es * (n0 * E + (n - n0) * p);
    for (int64_t k = 0; k < E; k += p) memcpy(h + es * k, col + es * k * width, es * p);
}

int decode_rows(const kernels *kn, const model *m, const void *embed, int64_t embed_rows, int64_t embed_block,
                int64_t embed_pad, const int64_t *tok, const int64_t *rows, const int64_t *ctx, int64_t R,
                const int32_t *table, int64_t table_rows, int64_t ld, void *logits, int nthreads, argmax_fn argmax,
                int64_t *best, const int64_t *adapter) {
    int64_t es = kn->es, E = m->hidden, W = 0;
    for (int64_t r = 0; r < R; r++) {
        if (tok[r] < 0 || tok[r] >= embed_rows || rows[r] < 0 || rows[r] >= table_rows || ctx[r] < 1 || ctx[r] > ld)
            return 5;
        if (ctx[r] > W) W = ctx[r];
    }
    /* h first, on a 64-byte boundary as a tensor's would be */
    int64_t hb = (es * R * E + 63) / 64 * 64;
    char *buf = aligned_alloc(64, hb + (8 * R * (2 + W) + 63) / 64 * 64);
    if (!buf) return 1;
    char *h = buf;
    int64_t *pos = (int64_t *)(buf + hb), *slot = pos + R, *win = slot + R;
    for (int64_t r = 0; r < R; r++) {
        const int32_t *row = table + rows[r] * ld;
        pos[r] = ctx[r] - 1; slot[r] = row[ctx[r] - 1];
        /* -1 inside the context: decode_forward refuses it */
        for (int64_t t = 0; t < W; t++) win[r * W + t] = t < ctx[r] ? row[t] : 0;
        embed_row(h + es * r * E, (const char *)embed, tok[r], embed_rows, E, es, embed_block, embed_pad);
    }
    int rc = decode_forward(kn, m, h, pos, slot, win, W, ctx, R, logits, nthreads, adapter);
    free(buf);
    if (!rc && argmax) argmax(logits, R, m->vocab, best);
    return rc;
}
