/* Small fused CPU kernels for a bfloat16 decode step (corral.engine.kernels.cpu_kernels).
 *
 * Plain C with no torch headers, so it builds in about a second with the system compiler.
 * Tensors arrive as raw pointers; the Python side has checked dtypes, shapes and contiguity.
 * Every kernel reads bfloat16, computes in float32 and rounds once to bfloat16 on the way out
 * (round to nearest even, as torch does). Slot indices come from the engine's bookkeeping, so
 * the attention kernel checks them against the pool size before touching memory.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16;

#include "int4.c" /* the 4-bit matmul, for the fused decode layer at the end */

/* Sixteen lanes in GCC's generic vectors: AVX-512 registers here, pairs of AVX2 (or four SSE)
 * elsewhere. The attention kernel takes head sizes that are multiples of VW. */
#define VW 16
typedef float f32v __attribute__((vector_size(4 * VW)));
typedef uint16_t u16v __attribute__((vector_size(2 * VW)));
typedef uint32_t u32v __attribute__((vector_size(4 * VW)));
typedef float f32h __attribute__((vector_size(2 * VW)));
typedef float f32q __attribute__((vector_size(VW)));

static inline float f32(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline bf16 to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

static inline f32v load16(const bf16 *p) {
    u16v h;
    memcpy(&h, p, sizeof h);
    u32v u = __builtin_convertvector(h, u32v) << 16;
    f32v f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline f32h halves(f32v v) {
    return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* The lane sums of four vectors at once, by a transpose-and-add tree. */
static inline f32q hsum4(f32v a, f32v b, f32v c, f32v d) {
    f32h ha = halves(a), hb = halves(b), hc = halves(c), hd = halves(d);
    f32h ab = __builtin_shufflevector(ha, hb, 0, 1, 2, 3, 8, 9, 10, 11) +
              __builtin_shufflevector(ha, hb, 4, 5, 6, 7, 12, 13, 14, 15);
    f32h cd = __builtin_shufflevector(hc, hd, 0, 1, 2, 3, 8, 9, 10, 11) +
              __builtin_shufflevector(hc, hd, 4, 5, 6, 7, 12, 13, 14, 15);
    f32h pairs = __builtin_shufflevector(ab, cd, 0, 1, 4, 5, 8, 9, 12, 13) +
                 __builtin_shufflevector(ab, cd, 2, 3, 6, 7, 10, 11, 14, 15);
    return __builtin_shufflevector(pairs, pairs, 0, 2, 4, 6) +
           __builtin_shufflevector(pairs, pairs, 1, 3, 5, 7);
}

static inline f32v dot_lanes(const f32v *q, const bf16 *k, int64_t nv) {
    f32v acc = q[0] * load16(k);
    for (int64_t c = 1; c < nv; c++) acc += q[c] * load16(k + c * VW);
    return acc;
}

/* exp in float32 to about 1 ulp, in plain arithmetic so that `omp simd` loops vectorise it
 * (libm's expf is a call per element): 2^n times a degree-6 polynomial on |r| <= ln2 / 2. */
static inline float exp_f32(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    /* round to nearest by the 1.5 * 2^23 trick: floorf does not vectorise without fast-math */
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* RMSNorm of `rows` rows of `n`: out = bf16(x * rsqrt(mean(x^2) + eps) * w), all in float32
 * with one rounding, as torch's CPU F.rms_norm does for bfloat16. */
static void norm_row(const bf16 *x, const bf16 *w, bf16 *out, int64_t n, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; i++) ss += f32(x[i]) * f32(x[i]);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = to_bf16(f32(x[i]) * r * f32(w[i]));
}

void corral_rms_norm(const bf16 *x, const bf16 *w, bf16 *out, int64_t rows, int64_t n,
                     float eps) {
    for (int64_t r = 0; r < rows; r++) norm_row(x + r * n, w, out + r * n, n, eps);
}

/* The residual add and the next norm in one pass: y = bf16(x + y) (in place), out = norm(y). */
void corral_add_rms_norm(const bf16 *x, bf16 *y, const bf16 *w, bf16 *out, int64_t rows,
                         int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        bf16 *yr = y + r * n;
        const bf16 *xr = x + r * n;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) yr[i] = to_bf16(f32(xr[i]) + f32(yr[i]));
        norm_row(yr, w, out + r * n, n, eps);
    }
}

/* Rotate-half RoPE in place on `heads` heads of `d` per row (row stride `stride` elements),
 * with the cos and signed-sin tables of corral.engine.execution.model.rope_cos_sin ([rows, d]). */
void corral_rope(bf16 *x, int64_t stride, const bf16 *cos, const bf16 *ssin, int64_t rows,
                 int64_t heads, int64_t d) {
    int64_t half = d / 2;
    for (int64_t t = 0; t < rows; t++) {
        const bf16 *c = cos + t * d, *s = ssin + t * d;
        for (int64_t h = 0; h < heads; h++) {
            bf16 *v = x + t * stride + h * d;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = f32(v[i]), b = f32(v[i + half]);
                v[i] = to_bf16(a * f32(c[i]) + b * f32(s[i]));
                v[i + half] = to_bf16(b * f32(c[i + half]) + a * f32(s[i + half]));
            }
        }
    }
}

/* out = silu(gate) * up for rows of [gate | up] (each `n` wide); silu is rounded to bfloat16
 * before the product, as torch's F.silu(gate) * up does. */
static void silu_mul_row(const bf16 *restrict g, const bf16 *restrict u, bf16 *restrict o,
                         int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float x = f32(g[i]);
        o[i] = to_bf16(f32(to_bf16(x / (1.0f + exp_f32(-x)))) * f32(u[i]));
    }
}

void corral_silu_mul(const bf16 *h, bf16 *out, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *gate = h + r * 2 * n;
        silu_mul_row(gate, gate + n, out + r * n, n);
    }
}

/* One (sequence, KV head): its `g` query rows attend over the sequence's `len` slots. `buf`:
 * 64-byte aligned, 2*g*d + g*len floats. */
static void attend(const bf16 *q, const bf16 *k_pool, const bf16 *v_pool, const int64_t *slots,
                   int64_t len, int64_t hkv, int64_t kvh, int64_t g, int64_t d, float scale,
                   bf16 *out, float *buf) {
    const int64_t nv = d / VW;
    f32v *qf = (f32v *)buf, *acc = qf + g * nv;
    float *scores = (float *)(acc + g * nv);
    for (int64_t i = 0; i < g * nv; i++) qf[i] = load16(q + i * VW) * scale;
    const int64_t row = hkv * d;
    for (int64_t r = 0; r < g; r++) { /* scores, four slots at a time */
        const f32v *qr = qf + r * nv;
        float *sr = scores + r * len;
        int64_t j = 0;
        for (; j + 4 <= len; j += 4) {
            const bf16 *k0 = k_pool + slots[j] * row + kvh * d;
            const bf16 *k1 = k_pool + slots[j + 1] * row + kvh * d;
            const bf16 *k2 = k_pool + slots[j + 2] * row + kvh * d;
            const bf16 *k3 = k_pool + slots[j + 3] * row + kvh * d;
            f32q s4 = hsum4(dot_lanes(qr, k0, nv), dot_lanes(qr, k1, nv), dot_lanes(qr, k2, nv),
                            dot_lanes(qr, k3, nv));
            memcpy(sr + j, &s4, sizeof s4);
        }
        for (; j < len; j++) {
            f32v z = {0};
            sr[j] = hsum4(dot_lanes(qr, k_pool + slots[j] * row + kvh * d, nv), z, z, z)[0];
        }
    }
    for (int64_t r = 0; r < g; r++) {
        float *sr = scores + r * len, mx = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < len; j++) mx = sr[j] > mx ? sr[j] : mx;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < len; j++) {
            sr[j] = exp_f32(sr[j] - mx);
            sum += sr[j];
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t j = 0; j < len; j++) sr[j] *= inv;
    }
    /* weighted V, up to four query rows at a time with their sums in registers */
    for (int64_t r0 = 0; r0 < g; r0 += 4) {
        int64_t nr = g - r0 < 4 ? g - r0 : 4;
        const float *p0 = scores + r0 * len, *p1 = nr > 1 ? p0 + len : p0;
        const float *p2 = nr > 2 ? p0 + 2 * len : p0, *p3 = nr > 3 ? p0 + 3 * len : p0;
        for (int64_t c = 0; c < nv; c++) {
            f32v a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int64_t j = 0; j < len; j++) {
                f32v vc = load16(v_pool + slots[j] * row + kvh * d + c * VW);
                a0 += p0[j] * vc;
                a1 += p1[j] * vc;
                a2 += p2[j] * vc;
                a3 += p3[j] * vc;
            }
            f32v sums[4] = {a0, a1, a2, a3};
            for (int64_t r = 0; r < nr; r++) acc[(r0 + r) * nv + c] = sums[r];
        }
    }
    const float *af = (const float *)acc;
#pragma omp simd
    for (int64_t i = 0; i < g * d; i++) out[i] = to_bf16(af[i]);
}

/* Paged decode attention over the pool, no gather copy.
 *
 * Decode row b (batch row rows[b] of t_rows) attends over slots kv[b*length : b*length+lens[b]];
 * its query is q + rows[b]*q_stride ([hkv*g, d], the g query heads of one KV head adjacent),
 * its output goes to out + b*(hkv*g*d). Unless `out_slots` is NULL, the row's new K/V
 * (k + rows[b]*k_stride, [hkv, d]; v likewise) are first stored in slot out_slots[rows[b]].
 * Returns 0; -1 (nothing touched) when a row, a slot or a length is out of range or `d` is not a
 * multiple of VW; -2 when out of memory.
 */
int corral_decode_attention(const bf16 *q, int64_t q_stride, int64_t t_rows, const bf16 *k,
                            int64_t k_stride, const bf16 *v, int64_t v_stride, bf16 *k_pool,
                            bf16 *v_pool, int64_t num_slots, const int64_t *rows,
                            const int64_t *kv, const int64_t *lens, int64_t batch, int64_t length,
                            int64_t hkv, int64_t g, int64_t d, float scale,
                            const int64_t *out_slots, bf16 *out, int threads) {
    if (d % VW) return -1;
    int64_t work = 0;
    for (int64_t b = 0; b < batch; b++) {
        if (rows[b] < 0 || rows[b] >= t_rows || lens[b] < 1 || lens[b] > length) return -1;
        for (int64_t j = 0; j < lens[b]; j++) {
            int64_t s = kv[b * length + j];
            if (s < 0 || s >= num_slots) return -1;
        }
        if (out_slots && (out_slots[rows[b]] < 0 || out_slots[rows[b]] >= num_slots)) return -1;
        work += lens[b];
    }
    if (out_slots) {
        for (int64_t b = 0; b < batch; b++) {
            int64_t slot = out_slots[rows[b]];
            memcpy(k_pool + slot * hkv * d, k + rows[b] * k_stride, (size_t)(hkv * d) * 2);
            memcpy(v_pool + slot * hkv * d, v + rows[b] * v_stride, (size_t)(hkv * d) * 2);
        }
    }
    /* Threads only pay off past a few hundred thousand multiply-adds (about 50 us of work). */
    int parallel = threads > 1 && work * hkv * g * d > (1 << 19);
    int failed = 0;
#pragma omp parallel num_threads(threads) if (parallel)
    {
        size_t bytes = (size_t)(2 * g * d + g * length) * sizeof(float);
        float *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < batch * hkv; task++) {
            if (!buf) continue;
            int64_t b = task / hkv, h = task % hkv;
            attend(q + rows[b] * q_stride + h * g * d, k_pool, v_pool, kv + b * length, lens[b],
                   hkv, h, g, d, scale, out + b * hkv * g * d + h * g * d, buf);
        }
        free(buf);
    }
    return failed ? -2 : 0;
}

/* One whole decoder layer of a decode-only step (every row one new token), in one call: the
 * same kernels in the same order as the layer's Python forward with bfloat16 CPU kernels, so
 * the result is the same bit for bit, without a Python round trip between them.
 *
 *   h = norm(x); qkv = h @ Wqkv; RoPE on q and k; store k, v at out_slots and attend (o);
 *   y = o @ Wo; y += x; h = norm(y); out = y + (silu(gate) * up)(h @ Wgu) @ Wdown
 *
 * x, out: [b, hidden]. Each W is (packed, scales) as corral_int4_matmul takes it: Wqkv
 * [(heads + 2 hkv) d, hidden], Wo [hidden, heads d], Wgu [2 inter, hidden], Wdown [hidden,
 * inter]. cos, ssin: [b, d]. The attention arguments are corral_decode_attention's, its rows
 * 0..b-1. Returns 0, or the first failing kernel's status (nothing more is done then). */
int corral_decode_layer(const bf16 *x, bf16 *out, int64_t b, int64_t hidden, const bf16 *norm1,
                        const bf16 *norm2, float eps, const uint8_t *wqkv, const bf16 *sqkv,
                        const uint8_t *wo, const bf16 *so, const uint8_t *wgu, const bf16 *sgu,
                        const uint8_t *wd, const bf16 *sd, int64_t inter, const bf16 *cos,
                        const bf16 *ssin, int64_t heads, int64_t hkv, int64_t d, bf16 *k_pool,
                        bf16 *v_pool, int64_t num_slots, const int64_t *rows, const int64_t *kv,
                        const int64_t *lens, int64_t length, const int64_t *out_slots,
                        float scale, int threads) {
    int64_t qkv_n = (heads + 2 * hkv) * d, q_n = heads * d;
    size_t elems = (size_t)(b * (hidden + qkv_n + q_n + hidden + 2 * inter + inter + hidden));
    bf16 *buf = malloc(elems * sizeof(bf16));
    if (!buf) return -2;
    bf16 *h = buf, *qkv = h + b * hidden, *o = qkv + b * qkv_n, *y = o + b * q_n;
    bf16 *gu = y + b * hidden, *s = gu + b * 2 * inter, *z = s + b * inter;
    int status;
    corral_rms_norm(x, norm1, h, b, hidden, eps);
    if ((status = corral_int4_matmul(h, b, hidden, wqkv, sqkv, qkv_n, qkv, threads))) goto done;
    corral_rope(qkv, qkv_n, cos, ssin, b, heads + hkv, d);
    status = corral_decode_attention(qkv, qkv_n, b, qkv + q_n, qkv_n, qkv + q_n + hkv * d, qkv_n,
                                     k_pool, v_pool, num_slots, rows, kv, lens, b, length, hkv,
                                     heads / hkv, d, scale, out_slots, o, threads);
    if (status) goto done;
    if ((status = corral_int4_matmul(o, b, q_n, wo, so, hidden, y, threads))) goto done;
    corral_add_rms_norm(x, y, norm2, h, b, hidden, eps);
    if ((status = corral_int4_matmul(h, b, hidden, wgu, sgu, 2 * inter, gu, threads))) goto done;
    corral_silu_mul(gu, s, b, inter);
    if ((status = corral_int4_matmul(s, b, inter, wd, sd, hidden, z, threads))) goto done;
    for (int64_t i = 0; i < b * hidden; i++) out[i] = to_bf16(f32(y[i]) + f32(z[i]));
done:
    free(buf);
    return status;
}
