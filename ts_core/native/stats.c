/* One pass over a tensor's memory: max, min, sum and sum of squares together.
 *
 * Part of the ts_core.native._kernels extension (setup.py), compiled with portable flags; the
 * float loops exist in three builds (x86-64 baseline, AVX2+F16C, AVX-512) and the one this CPU
 * runs is chosen once at import (tsp_stats_init, __builtin_cpu_supports). Never -march=native:
 * one installed library serves every CPU generation sharing a venv.
 *
 * Floating input is accumulated in float32 within blocks of BLOCK elements over LANES fixed
 * lanes (lane l takes elements l, l+LANES, ...), the lanes summed as a fixed tree, and in double
 * across blocks. The order of every addition is written down here (no reassociation by the
 * compiler, -ffp-contract=off: no FMA), so all three builds give the same bits: a dump's
 * statistics do not depend on the CPU that took them. Returns 0 when every value was finite,
 * 1 when a NaN/Inf was met (the caller then uses its exact framework path), -1 for an
 * unsupported dtype code.
 *
 * Wide enough for every finite tensor: a block whose float32 sums overflow while its values are
 * finite (a float32 attention mask filled with finfo.min: 512 * -3.4e38) is summed again in
 * double, in element order (the rare case pays one more read of 512 values; the common case one
 * isfinite test per block). Float64 input can overflow even double: then the mean and the norm
 * are computed again over the whole tensor on values scaled by powers of two (exact), and the
 * kernel returns 2 with out = [max, min, mean, norm] (the norm is infinite only when the true
 * norm is beyond the float64 range).
 */
#include <stdint.h>
#include <math.h>
#include "kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define TSP_X86 1
#include <immintrin.h>
#endif

#define BLOCK 512
#define LANES 16

/* bits_to_f32, f32_to_bits, bf16_to_f32, f16_to_f32: kernels.h (compare.c widens them too) */

/* Reduce elements [0, len) of one block, element i read as LOAD(i), into the float32 block
 * results bs, bq, bmx, bmn (lane order fixed, see the header). */
#define BLOCK_REDUCE(T, LOAD)                                                          \
    T ls[LANES], lq[LANES], lmx[LANES], lmn[LANES];                                    \
    for (int l = 0; l < LANES; l++) { ls[l] = 0; lq[l] = 0; lmx[l] = -INFINITY; lmn[l] = INFINITY; } \
    int64_t i = 0;                                                                     \
    for (; i + LANES <= len; i += LANES)                                               \
        for (int l = 0; l < LANES; l++) {                                              \
            T v = LOAD(i + l);                                                         \
            ls[l] += v; lq[l] += v * v;                                                \
            lmx[l] = v > lmx[l] ? v : lmx[l];                                          \
            lmn[l] = v < lmn[l] ? v : lmn[l];                                          \
        }                                                                              \
    for (int l = 0; i < len; i++, l++) {                                               \
        T v = LOAD(i);                                                                 \
        ls[l] += v; lq[l] += v * v;                                                    \
        lmx[l] = v > lmx[l] ? v : lmx[l];                                              \
        lmn[l] = v < lmn[l] ? v : lmn[l];                                              \
    }                                                                                  \
    for (int w = LANES / 2; w > 0; w /= 2)                                             \
        for (int l = 0; l < w; l++) {                                                  \
            ls[l] += ls[l + w]; lq[l] += lq[l + w];                                    \
            lmx[l] = lmx[l + w] > lmx[l] ? lmx[l + w] : lmx[l];                        \
            lmn[l] = lmn[l + w] < lmn[l] ? lmn[l + w] : lmn[l];                        \
        }

/* Block sums of one block again in double, element order, when the T sums overflowed while
 * max and min are finite (a NaN keeps them finite too: it then still shows in the double sums). */
#define BLOCK_SUMS(LOAD)                                                               \
    double bsum = ls[0], bsq = lq[0];                                                  \
    if (!isfinite(bsum + bsq) && isfinite(lmx[0]) && isfinite(lmn[0])) {               \
        bsum = 0.0; bsq = 0.0;                                                         \
        for (int64_t k = 0; k < len; k++) {                                            \
            double v = (double)LOAD(k);                                                \
            bsum += v; bsq += v * v;                                                   \
        }                                                                              \
    }                                                                                  \
    sum += bsum; sq += bsq;

#define FINISH(T)                                                                      \
    out[0] = mx; out[1] = mn; out[2] = sum; out[3] = sq;                               \
    return (isfinite(sum) && isfinite(sq) && isfinite(mx) && isfinite(mn)) ? 0 : 1;

/* Float64 input whose double sums overflowed with finite max and min: mean and norm over values
 * scaled by powers of two (exact for normal numbers; the values the scaling flushes to zero are
 * below 2^-400, nothing beside the ones that overflowed). Returns 2 (out = max, min, mean,
 * norm), or 1 when a NaN is there after all. */
static int rescue_f64(const double *x, int64_t n, double *out) {
    double s = 0.0, q = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) return 1;
        double a = x[i] * 0x1p-64, b = x[i] * 0x1p-600;
        s += a; q += b * b;
    }
    double mean = isfinite(out[2]) ? out[2] / (double)n : (s / (double)n) * 0x1p64;
    mean = mean > out[0] ? out[0] : mean < out[1] ? out[1] : mean;    /* a mean lies in [min, max] */
    out[2] = mean;
    out[3] = isfinite(out[3]) ? sqrt(out[3]) : sqrt(q) * 0x1p600;
    return 2;
}

/* A float kernel over blocks: each block reduced in T (float32 or float64), blocks summed in
 * double. */
#define FLOAT_KERNEL(NAME, ATTR, IN, T, CONVERT)                                       \
    ATTR static int NAME(const IN *x, int64_t n, double *out) {                        \
        T mx = -INFINITY, mn = INFINITY;                                               \
        double sum = 0.0, sq = 0.0;                                                    \
        for (int64_t s = 0; s < n; s += BLOCK) {                                       \
            int64_t len = s + BLOCK < n ? BLOCK : n - s;                               \
            const IN *b = x + s;                                                       \
            BLOCK_REDUCE(T, CONVERT)                                                   \
            BLOCK_SUMS(CONVERT)                                                        \
            mx = lmx[0] > mx ? lmx[0] : mx;                                            \
            mn = lmn[0] < mn ? lmn[0] : mn;                                            \
        }                                                                              \
        FINISH(T)                                                                      \
    }

#define LOAD_PLAIN(k) b[k]
#define LOAD_F16(k) f16_to_f32(b[k])
#define LOAD_BF16(k) bf16_to_f32(b[k])

/* The float kernels of one instruction set; SUF names it, ATTR targets it. */
#define FLOAT_KERNELS(SUF, ATTR)                                                       \
    FLOAT_KERNEL(stats_f32_##SUF, ATTR, float, float, LOAD_PLAIN)                      \
    FLOAT_KERNEL(stats_f64_##SUF, ATTR, double, double, LOAD_PLAIN)                    \
    FLOAT_KERNEL(stats_bf16_##SUF, ATTR, uint16_t, float, LOAD_BF16)

FLOAT_KERNELS(base, )
FLOAT_KERNEL(stats_f16_base, , uint16_t, float, LOAD_F16)   /* with F16C: stats_f16c_* below */

#ifdef TSP_X86
#define ATTR_AVX2 __attribute__((target("avx2,f16c")))
/* AVX-512 as Skylake-SP and later have it (DQ: int64 <-> double in vectors) */
#define ATTR_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,f16c")))
FLOAT_KERNELS(avx2, ATTR_AVX2)
FLOAT_KERNELS(avx512, ATTR_AVX512)

/* F16C: each block converted to float32 eight values at a time (exact, as f16_to_f32), then
 * reduced like float32 input: the same bits as the portable conversion. */
#define F16C_KERNEL(SUF, ATTR)                                                         \
    ATTR static int stats_f16c_##SUF(const uint16_t *h, int64_t n, double *out) {      \
        float buf[BLOCK];                                                              \
        float mx = -INFINITY, mn = INFINITY;                                           \
        double sum = 0.0, sq = 0.0;                                                    \
        for (int64_t s = 0; s < n; s += BLOCK) {                                       \
            int64_t len = s + BLOCK < n ? BLOCK : n - s, j = 0;                        \
            for (; j + 8 <= len; j += 8)                                               \
                _mm256_storeu_ps(buf + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + s + j)))); \
            for (; j < len; j++)                                                       \
                buf[j] = f16_to_f32(h[s + j]);                                         \
            const float *b = buf;                                                      \
            BLOCK_REDUCE(float, LOAD_PLAIN)                                            \
            BLOCK_SUMS(LOAD_PLAIN)                                                     \
            mx = lmx[0] > mx ? lmx[0] : mx;                                            \
            mn = lmn[0] < mn ? lmn[0] : mn;                                            \
        }                                                                              \
        FINISH(float)                                                                  \
    }
F16C_KERNEL(avx2, ATTR_AVX2)
F16C_KERNEL(avx512, ATTR_AVX512)
#endif

/* Integers: exact max/min (as int64, then double), sum and sum of squares in double, in element
 * order (no reassociation: the same on every CPU; the wider builds only convert faster). */
#define INT_KERNEL(NAME, ATTR, T)                                                 \
    ATTR static int NAME(const void *p, int64_t n, double *out) {                 \
        const T *x = (const T *)p;                                                \
        int64_t mx = (int64_t)x[0], mn = (int64_t)x[0];                           \
        double sum = 0.0, sq = 0.0;                                               \
        for (int64_t i = 0; i < n; i++) {                                         \
            int64_t v = (int64_t)x[i];                                            \
            double d = (double)v;                                                 \
            sum += d;                                                             \
            sq += d * d;                                                          \
            mx = v > mx ? v : mx;                                                 \
            mn = v < mn ? v : mn;                                                 \
        }                                                                         \
        out[0] = (double)mx; out[1] = (double)mn; out[2] = sum; out[3] = sq;      \
        return 0;                                                                 \
    }
#define INT_KERNELS(SUF, ATTR)                                                    \
    INT_KERNEL(stats_i8_##SUF, ATTR, int8_t)                                      \
    INT_KERNEL(stats_u8_##SUF, ATTR, uint8_t)                                     \
    INT_KERNEL(stats_i16_##SUF, ATTR, int16_t)                                    \
    INT_KERNEL(stats_i32_##SUF, ATTR, int32_t)                                    \
    INT_KERNEL(stats_i64_##SUF, ATTR, int64_t)

INT_KERNELS(base, )
#ifdef TSP_X86
INT_KERNELS(avx2, ATTR_AVX2)
INT_KERNELS(avx512, ATTR_AVX512)
#endif

typedef int (*f32_fn)(const float *, int64_t, double *);
typedef int (*f64_fn)(const double *, int64_t, double *);
typedef int (*u16_fn)(const uint16_t *, int64_t, double *);
typedef int (*int_fn)(const void *, int64_t, double *);
#define INTS(SUF) { stats_i8_##SUF, stats_u8_##SUF, stats_i16_##SUF, stats_i32_##SUF, stats_i64_##SUF }
static const int_fn ints_base[5] = INTS(base);
#ifdef TSP_X86
static const int_fn ints_avx2[5] = INTS(avx2);
static const int_fn ints_avx512[5] = INTS(avx512);
#endif

static f32_fn k_f32 = stats_f32_base;
static f64_fn k_f64 = stats_f64_base;
static u16_fn k_f16 = stats_f16_base;
static u16_fn k_bf16 = stats_bf16_base;
static const int_fn *k_int = ints_base;    /* i8, u8, i16, i32, i64 */
static const char *k_isa = "baseline";

const char *tsp_stats_init(int allow_simd) {
    k_f32 = stats_f32_base; k_f64 = stats_f64_base; k_f16 = stats_f16_base; k_bf16 = stats_bf16_base;
    k_int = ints_base; k_isa = "baseline";
    tsp_compare_init(0);
#ifdef TSP_X86
    if (!allow_simd) return k_isa;
    __builtin_cpu_init();
#if defined(__clang__)       /* older clang cannot query F16C: every AVX2 CPU has it (Haswell, Zen) */
    int f16c = __builtin_cpu_supports("avx") != 0;
#else
    int f16c = __builtin_cpu_supports("f16c") != 0;
#endif
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && f16c) {
        k_f32 = stats_f32_avx512; k_f64 = stats_f64_avx512; k_f16 = stats_f16c_avx512;
        k_bf16 = stats_bf16_avx512; k_int = ints_avx512; k_isa = "avx512";
        tsp_compare_init(1);
    } else if (__builtin_cpu_supports("avx2") && f16c) {
        k_f32 = stats_f32_avx2; k_f64 = stats_f64_avx2; k_f16 = stats_f16c_avx2;
        k_bf16 = stats_bf16_avx2; k_int = ints_avx2; k_isa = "avx2+f16c";
        tsp_compare_init(1);
    }
#else
    (void)allow_simd;
#endif
    return k_isa;
}

int tsp_stats(const void *p, int64_t n, int dtype, double *out) {
    if (n <= 0) return -1;
    switch (dtype) {
    case TSP_F32: return k_f32((const float *)p, n, out);
    case TSP_F64: {
        int rc = k_f64((const double *)p, n, out);
        return rc == 1 && isfinite(out[0]) && isfinite(out[1]) ? rescue_f64((const double *)p, n, out) : rc;
    }
    case TSP_F16: return k_f16((const uint16_t *)p, n, out);
    case TSP_BF16: return k_bf16((const uint16_t *)p, n, out);
    case TSP_I8: return k_int[0](p, n, out);
    case TSP_U8: case TSP_BOOL: return k_int[1](p, n, out);
    case TSP_I16: return k_int[2](p, n, out);
    case TSP_I32: return k_int[3](p, n, out);
    case TSP_I64: return k_int[4](p, n, out);
    default: return -1;
    }
}
