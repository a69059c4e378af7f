/* 4-bit weight matmul for the CPU (corral.engine.kernels.cpu_int4): y = x @ W.T with W in torch's
 * `_convert_weight_to_int4pack_for_cpu` layout, read in place (no second copy of the weights).
 *
 * The layout, per block of 64 output rows: for each input column k, 32 bytes; byte j holds row
 * j in its low nibble and row j + 32 in its high nibble. `sz` is [K/32, N, 2] bfloat16 (scale,
 * zero) and W[n, k] = (q - 8) * scale + zero over each group of 32 columns.
 *
 * The activations are quantized per row and group of 32 to int8 (scale max|x| / 127, round to
 * nearest), as llama.cpp does for its 4-bit dot products, so that one AVX-512 VNNI instruction
 * (vpdpbusd: unsigned 4-bit weight times signed 8-bit activation, four at a time) does 64
 * multiply-adds. Per group and row:
 *     sum_k x[k] * W[n, k] = scale[n] * sx * (sum_k xq[k] * q[n, k] - 8 * sum_k xq[k])
 *                          + zero[n] * sum_k x[k]
 * with sx the group's activation scale and sum_k x[k] exact in float32. A vpermt2b per 16 rows
 * turns four columns of the layout into the four bytes of each 32-bit lane that vpdpbusd reads.
 *
 * Built only where the compiler targets AVX512-VNNI and AVX512-VBMI (`-march=native`);
 * `corral_int4_available` says whether it was, and the caller keeps torch's kernel otherwise.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16;

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__AVX512BW__)
#include <immintrin.h>

#define GROUP 32
#define BLOCK_N 64
#define ROWS 2 /* activation rows per pass over a block's weights */

static inline float bf16_to_f32(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Quantize one row of `k` bfloat16 activations into two int8 parts per group of 32:
 * x ~ sx * xq + (sx / 254) * xr, where xr rounds what xq left over (|x - sx * xq| <= sx / 2),
 * so the pair carries about 15 bits, more than bfloat16's 8. Per group: sx, the exact sum of x,
 * and the sums of xq and xr (the -8 offset's correction). */
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
        float d = amax / 127.f, inv = amax > 0 ? 127.f / amax : 0.f;
        int32_t qs = 0, rs = 0;
        for (int i = 0; i < GROUP; i++) {
            float r = v[i] * inv;
            int32_t q = (int32_t)(r + (r >= 0 ? 0.5f : -0.5f));
            float rest = (r - (float)q) * 254.f; /* in [-127, 127] */
            int32_t e = (int32_t)(rest + (rest >= 0 ? 0.5f : -0.5f));
            e = e > 127 ? 127 : e < -127 ? -127 : e;
            xq[g * GROUP + i] = (int8_t)q, xr[g * GROUP + i] = (int8_t)e;
            qs += q, rs += e;
        }
        scale[g] = d, sum[g] = s, qsum[g] = qs, rsum[g] = rs;
    }
}

static inline bf16 f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40); /* NaN stays NaN */
    return (bf16)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* Rows [r0, r0 + nr) of the output, one block of 64 output columns. */
static void block(const int8_t *xq, const int8_t *xr, const float *xs, const float *xsum,
                  const int32_t *xqs, const int32_t *xrs, int64_t nr, int64_t k, const uint8_t *w,
                  const bf16 *sz, int64_t n, int64_t n0, bf16 *out, int64_t out_stride) {
    const int64_t groups = k / GROUP;
    /* lane i of a 16-row tile reads bytes (k, k+1, k+2, k+3) of row i: low nibbles of the
     * first 64-byte load hold k (bytes 0..31) and k+1 (32..63), the second load k+2 and k+3. */
    uint8_t lo_idx[64], hi_idx[64];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 4; j++) {
            lo_idx[4 * i + j] = (uint8_t)(i + 32 * j);
            hi_idx[4 * i + j] = (uint8_t)(16 + i + 32 * j);
        }
    const __m512i idx0 = _mm512_loadu_si512(lo_idx), idx1 = _mm512_loadu_si512(hi_idx);
    const __m512i nib = _mm512_set1_epi8(0x0f);
    __m512 acc[ROWS][4];
    for (int r = 0; r < ROWS; r++)
        for (int t = 0; t < 4; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512i dot[ROWS][4], rdot[ROWS][4];
        for (int r = 0; r < ROWS; r++)
            for (int t = 0; t < 4; t++) dot[r][t] = rdot[r][t] = _mm512_setzero_si512();
        const uint8_t *wg = w + g * GROUP * 32;
        for (int s = 0; s < GROUP / 4; s++) {
            __m512i a = _mm512_loadu_si512(wg + s * 128), b = _mm512_loadu_si512(wg + s * 128 + 64);
            __m512i la = _mm512_and_si512(a, nib), lb = _mm512_and_si512(b, nib);
            __m512i ha = _mm512_and_si512(_mm512_srli_epi16(a, 4), nib);
            __m512i hb = _mm512_and_si512(_mm512_srli_epi16(b, 4), nib);
            __m512i t[4] = {
                _mm512_permutex2var_epi8(la, idx0, lb), /* rows 0..15 */
                _mm512_permutex2var_epi8(la, idx1, lb), /* rows 16..31 */
                _mm512_permutex2var_epi8(ha, idx0, hb), /* rows 32..47 */
                _mm512_permutex2var_epi8(ha, idx1, hb), /* rows 48..63 */
            };
            for (int r = 0; r < nr; r++) {
                int32_t four, rest;
                memcpy(&four, xq + r * k + g * GROUP + 4 * s, 4);
                memcpy(&rest, xr + r * k + g * GROUP + 4 * s, 4);
                __m512i xb = _mm512_set1_epi32(four), rb = _mm512_set1_epi32(rest);
                for (int u = 0; u < 4; u++) {
                    dot[r][u] = _mm512_dpbusd_epi32(dot[r][u], t[u], xb);
                    rdot[r][u] = _mm512_dpbusd_epi32(rdot[r][u], t[u], rb);
                }
            }
        }
        /* (scale, zero) pairs of 16 rows as 32-bit lanes: scale in the low half, zero high */
        const bf16 *szg = sz + (g * n + n0) * 2;
        for (int u = 0; u < 4; u++) {
            __m512i pair = _mm512_loadu_si512(szg + 32 * u);
            __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
            __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(pair, _mm512_set1_epi32(-65536)));
            for (int r = 0; r < nr; r++) {
                /* 254 * (xq . q) + (xr . q), centred: exact in int32 (|.| < 2^24) */
                int32_t off = 8 * (254 * xqs[r * groups + g] + xrs[r * groups + g]);
                __m512i both = _mm512_add_epi32(_mm512_mullo_epi32(dot[r][u], _mm512_set1_epi32(254)),
                                                rdot[r][u]);
                __m512i centred = _mm512_sub_epi32(both, _mm512_set1_epi32(off));
                __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(centred),
                                         _mm512_set1_ps(xs[r * groups + g] / 254.f));
                acc[r][u] = _mm512_fmadd_ps(d, scale, acc[r][u]);
                acc[r][u] = _mm512_fmadd_ps(_mm512_set1_ps(xsum[r * groups + g]), zero, acc[r][u]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        float y[BLOCK_N];
        for (int u = 0; u < 4; u++) _mm512_storeu_ps(y + 16 * u, acc[r][u]);
        for (int i = 0; i < BLOCK_N; i++) out[r * out_stride + n0 + i] = f32_to_bf16(y[i]);
    }
}

int corral_int4_available(void) { return 1; }

/* out [m, n] bfloat16 = x [m, k] bfloat16 @ W.T. Returns 0; -1 when a size is off the grid
 * (k a multiple of 32, n of 64); -2 when out of memory. */
int corral_int4_matmul(const bf16 *x, int64_t m, int64_t k, const uint8_t *w, const bf16 *sz,
                       int64_t n, bf16 *out, int threads) {
    if (m < 1 || k < GROUP || k % GROUP || n < BLOCK_N || n % BLOCK_N) return -1;
    const int64_t groups = k / GROUP;
    int8_t *xq = malloc((size_t)(2 * m * k)), *xr = xq + m * k;
    float *xs = malloc(sizeof(float) * m * groups), *xsum = malloc(sizeof(float) * m * groups);
    int32_t *xqs = malloc(sizeof(int32_t) * 2 * m * groups), *xrs = xqs + m * groups;
    int status = 0;
    if (!xq || !xs || !xsum || !xqs) {
        status = -2;
        goto done;
    }
    for (int64_t r = 0; r < m; r++)
        quantize_row(x + r * k, k, xq + r * k, xr + r * k, xs + r * groups, xsum + r * groups,
                     xqs + r * groups, xrs + r * groups);
    const int64_t blocks = n / BLOCK_N, tiles = (m + ROWS - 1) / ROWS;
    /* Even a batch-1 matmul of a few hundred thousand weights streams them from memory, and a
     * second core adds bandwidth: threads pay off past about 2 us of work. */
    int parallel = threads > 1 && m * n * k > (1 << 20);
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (parallel)
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t tile = 0; tile < tiles; tile++) {
            int64_t r0 = tile * ROWS, nr = m - r0 < ROWS ? m - r0 : ROWS;
            block(xq + r0 * k, xr + r0 * k, xs + r0 * groups, xsum + r0 * groups,
                  xqs + r0 * groups, xrs + r0 * groups, nr, k, w + b * BLOCK_N * k / 2, sz, n,
                  b * BLOCK_N, out + r0 * n, n);
        }
done:
    free(xq), free(xs), free(xsum), free(xqs);
    return status;
}

#else
int corral_int4_available(void) { return 0; }
int corral_int4_matmul(const bf16 *x, int64_t m, int64_t k, const uint8_t *w, const bf16 *sz,
                       int64_t n, bf16 *out, int threads) {
    (void)x, (void)m, (void)k, (void)w, (void)sz, (void)n, (void)out, (void)threads;
    return -1;
}
#endif
