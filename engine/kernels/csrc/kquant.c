/* 8-bit weight matmul for GGUF's Q6_K and Q5_K tensors kept quantized on the CPU
 * (corral.engine.kernels.cpu_kquant): y = x @ W.T with
 *
 *     W[n, k] = d[s, n] * sc[g, n] * (u[n, k] - off) - dm[s, n] * mn[g, n]
 *
 * over groups g = k / 16 and super-blocks s = k / 256. u is unsigned 8-bit (Q6_K: q + 32 in 0..63
 * with off 32; Q5_K: q in 0..31 with off 0), sc int8 [K/16, N], mn uint8 [K/16, N] (NULL: no min
 * term, Q6_K), d and dm float32 [K/256, N] (the fp16 block constants, exact). Every product of
 * the formula is exact in float32, so the weights are GGUF's dequantized values bit for bit.
 *
 * Layout of u, per block of 64 output rows: for each 4 input columns k..k+3, 256 bytes; 16-row
 * tile t sits at bytes 64t..64t+63 and its lane i holds row 16t+i's four bytes u[k..k+3], the
 * operand vpdpbusd reads as is. The activations are quantized per row and group of 16 into two
 * int8 parts (x ~ sx * (xq + xr / 254), about 15 bits), as in int4.c. Per group and row:
 *     sum_k x[k] * W[n, k] = d sc sx (254 (xq . u) + (xr . u) - off (254 sum xq + sum xr)) / 254
 *                          - dm mn sum_k x[k]
 * with the integer part exact in int32 and sum_k x[k] exact in float32. A block's 16 columns of
 * weights are loaded once into registers and used for every activation row, so the weights
 * stream from memory once per call whatever the row count.
 *
 * Built only where the compiler targets AVX512-VNNI (`-march=native`); `corral_kquant_available`
 * says whether it was, and the caller keeps the weights dense otherwise.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>

#define GROUP 16
#define SUPER 256
#define BLOCK_N 64

static inline float bf16_to_f32(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline bf16 f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40); /* NaN stays NaN */
    return (bf16)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* One row of k bfloat16 activations as two int8 parts per group of 16, with per group the
 * scale, the exact float sum and the sums of both parts. */
static void quantize_row(const bf16 *x, int64_t k, int8_t *xq, int8_t *xr, float *scale,
                         float *sum, int32_t *qsum, int32_t *rsum) {
    for (int64_t g = 0; g < k / GROUP; g++) {
        float v[GROUP], amax = 0.f, s = 0.f;
        for (int i = 0; i < GROUP; i++) {
            v[i] = bf16_to_f32(x[g * GROUP + i]);
            float a = v[i] < 0 ? -v[i] : v[i];
            amax = a > amax ? a : amax;
            s += v[i];
        }
        float inv = amax > 0 ? 127.f / amax : 0.f;
        int32_t qs = 0, rs = 0;
        for (int i = 0; i < GROUP; i++) {
            float r = v[i] * inv;
            int32_t q = (int32_t)(r + (r >= 0 ? 0.5f : -0.5f));
            float rest = (r - (float)q) * 254.f;
            int32_t e = (int32_t)(rest + (rest >= 0 ? 0.5f : -0.5f));
            e = e > 127 ? 127 : e < -127 ? -127 : e;
            xq[g * GROUP + i] = (int8_t)q, xr[g * GROUP + i] = (int8_t)e;
            qs += q, rs += e;
        }
        scale[g] = amax / 127.f, sum[g] = s, qsum[g] = qs, rsum[g] = rs;
    }
}

typedef struct {
    const int8_t *xq, *xr;
    const float *xs, *xsum;
    const int32_t *xqs, *xrs;
} acts;

typedef struct {
    const uint8_t *u;
    const int8_t *sc;
    const uint8_t *mn;
    const float *d, *dm;
    int32_t off;
    int64_t n, k;
} weights;

/* Every row of `a` (m of them) times the 64 output rows starting at n0. A group's 16 columns of
 * the block's weights (1 KiB) are loaded once into registers and used for every row, so the
 * weights stream from memory once whatever m is; the rows' float32 sums live in `acc` (m * 64). */
static void block(acts a, int64_t m, weights w, int64_t n0, float *acc, bf16 *out,
                  int64_t out_stride) {
    const int64_t k = w.k, n = w.n, groups = k / GROUP;
    const uint8_t *ub = w.u + n0 * k; /* this block's 64 rows: 64 * k bytes */
    memset(acc, 0, sizeof(float) * m * BLOCK_N);
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *ug = ub + g * GROUP * BLOCK_N;
        __m512i wt[GROUP / 4][4];
        for (int s = 0; s < GROUP / 4; s++)
            for (int u = 0; u < 4; u++) wt[s][u] = _mm512_loadu_si512(ug + s * 256 + 64 * u);
        const int64_t sb = g / (SUPER / GROUP);
        float scale[BLOCK_N], mins[BLOCK_N];
        for (int u = 0; u < 4; u++) {
            const int64_t rows = n0 + 16 * u;
            __m128i sc8 = _mm_loadu_si128((const __m128i *)(w.sc + g * n + rows));
            _mm512_storeu_ps(scale + 16 * u,
                             _mm512_mul_ps(_mm512_loadu_ps(w.d + sb * n + rows),
                                           _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8))));
            if (w.mn) {
                __m128i m8 = _mm_loadu_si128((const __m128i *)(w.mn + g * n + rows));
                _mm512_storeu_ps(mins + 16 * u,
                                 _mm512_mul_ps(_mm512_loadu_ps(w.dm + sb * n + rows),
                                               _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(m8))));
            }
        }
        for (int64_t r = 0; r < m; r++) {
            __m512i dot[4], rdot[4];
            for (int u = 0; u < 4; u++) dot[u] = rdot[u] = _mm512_setzero_si512();
            for (int s = 0; s < GROUP / 4; s++) {
                int32_t four, rest;
                memcpy(&four, a.xq + r * k + g * GROUP + 4 * s, 4);
                memcpy(&rest, a.xr + r * k + g * GROUP + 4 * s, 4);
                __m512i xb = _mm512_set1_epi32(four), rb = _mm512_set1_epi32(rest);
                for (int u = 0; u < 4; u++) {
                    dot[u] = _mm512_dpbusd_epi32(dot[u], wt[s][u], xb);
                    rdot[u] = _mm512_dpbusd_epi32(rdot[u], wt[s][u], rb);
                }
            }
            const int64_t i = r * groups + g;
            const __m512i centre = _mm512_set1_epi32(w.off * (254 * a.xqs[i] + a.xrs[i]));
            const __m512 xs = _mm512_set1_ps(a.xs[i] / 254.f), xsum = _mm512_set1_ps(a.xsum[i]);
            float *acc_r = acc + r * BLOCK_N;
            for (int u = 0; u < 4; u++) {
                __m512i both =
                    _mm512_add_epi32(_mm512_mullo_epi32(dot[u], _mm512_set1_epi32(254)), rdot[u]);
                __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(both, centre)), xs);
                __m512 sum = _mm512_fmadd_ps(v, _mm512_loadu_ps(scale + 16 * u),
                                             _mm512_loadu_ps(acc_r + 16 * u));
                if (w.mn) sum = _mm512_fnmadd_ps(xsum, _mm512_loadu_ps(mins + 16 * u), sum);
                _mm512_storeu_ps(acc_r + 16 * u, sum);
            }
        }
    }
    for (int64_t r = 0; r < m; r++)
        for (int i = 0; i < BLOCK_N; i++)
            out[r * out_stride + n0 + i] = f32_to_bf16(acc[r * BLOCK_N + i]);
}

int corral_kquant_available(void) { return 1; }

/* out [m, n] bfloat16 = x [m, k] bfloat16 @ W.T. Returns 0; -1 when a size is off the grid
 * (k a multiple of 256, n of 64); -2 when out of memory. */
int corral_kquant_matmul(const bf16 *x, int64_t m, int64_t k, const uint8_t *u, const int8_t *sc,
                         const uint8_t *mn, const float *d, const float *dm, int32_t off,
                         int64_t n, bf16 *out, int threads) {
    if (m < 1 || k < SUPER || k % SUPER || n < BLOCK_N || n % BLOCK_N || (mn && !dm)) return -1;
    const int64_t groups = k / GROUP;
    int8_t *xq = malloc((size_t)(2 * m * k)), *xr = xq + m * k;
    float *xs = malloc(sizeof(float) * 2 * m * groups), *xsum = xs + m * groups;
    int32_t *xqs = malloc(sizeof(int32_t) * 2 * m * groups), *xrs = xqs + m * groups;
    int status = 0;
    if (!xq || !xs || !xqs) {
        status = -2;
        goto done;
    }
    for (int64_t r = 0; r < m; r++)
        quantize_row(x + r * k, k, xq + r * k, xr + r * k, xs + r * groups, xsum + r * groups,
                     xqs + r * groups, xrs + r * groups);
    const weights w = {u, sc, mn, d, dm, off, n, k};
    const acts a = {xq, xr, xs, xsum, xqs, xrs};
    const int64_t blocks = n / BLOCK_N;
    int parallel = threads > 1 && m * n * k > (1 << 20);
#pragma omp parallel num_threads(threads) if (parallel)
    {
        float *acc = malloc(sizeof(float) * m * BLOCK_N);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++)
            if (acc) block(a, m, w, b * BLOCK_N, acc, out, n);
        if (!acc) {
#pragma omp atomic write
            status = -2;
        }
        free(acc);
    }
done:
    free(xq), free(xs), free(xqs);
    return status;
}

#else
int corral_kquant_available(void) { return 0; }
int corral_kquant_matmul(const bf16 *x, int64_t m, int64_t k, const uint8_t *u, const int8_t *sc,
                         const uint8_t *mn, const float *d, const float *dm, int32_t off,
                         int64_t n, bf16 *out, int threads) {
    (void)x, (void)m, (void)k, (void)u, (void)sc, (void)mn, (void)d, (void)dm, (void)off;
    (void)n, (void)out, (void)threads;
    return -1;
}
#endif
