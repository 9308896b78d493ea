/* One pass over a tensor's memory: max, min, sum and sum of squares together.
 *
 * Built by ts_core/native/build.py at install time (make) with the host's vector
 * instructions; loaded through ctypes (no Python or framework headers needed).
 * Floating input is accumulated in float32 within blocks of BLOCK elements (vector lanes
 * summed pairwise by the compiler) and in double across blocks. Returns 0 when every value
 * was finite, 1 when a NaN/Inf was met (the caller then uses its exact framework path),
 * -1 for an unsupported dtype code.
 */
#include <stdint.h>
#include <math.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#define BLOCK 512

enum { F32 = 0, F64 = 1, F16 = 2, BF16 = 3, I8 = 4, U8 = 5, I16 = 6, I32 = 7, I64 = 8, BOOL = 9 };

static inline float bits_to_f32(uint32_t u) {
    union { uint32_t u; float f; } v;
    v.u = u;
    return v.f;
}

static inline uint32_t f32_to_bits(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    return v.u;
}

static inline float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

/* IEEE half -> float without branches (vectorises): exponent re-biased by one multiply,
 * which also turns half subnormals into float normals; Inf/NaN selected explicitly. */
static inline float f16_to_f32(uint16_t h) {
    uint32_t em = h & 0x7fffu;
    float mag = bits_to_f32(em << 13) * 0x1p112f;
    uint32_t bits = em >= 0x7c00u ? ((em << 13) | 0x7f800000u) : f32_to_bits(mag);
    return bits_to_f32(bits | ((uint32_t)(h & 0x8000u) << 16));
}

#define FLOAT_BODY(LOAD)                                                          \
    float mx = -INFINITY, mn = INFINITY;                                          \
    double sum = 0.0, sq = 0.0;                                                   \
    for (int64_t s = 0; s < n; s += BLOCK) {                                      \
        int64_t e = s + BLOCK < n ? s + BLOCK : n;                                \
        float bs = 0.f, bq = 0.f, bmx = -INFINITY, bmn = INFINITY;                \
        _Pragma("omp simd reduction(+:bs,bq) reduction(max:bmx) reduction(min:bmn)") \
        for (int64_t i = s; i < e; i++) {                                         \
            float v = LOAD;                                                       \
            bs += v;                                                              \
            bq += v * v;                                                          \
            bmx = v > bmx ? v : bmx;                                              \
            bmn = v < bmn ? v : bmn;                                              \
        }                                                                         \
        sum += bs;                                                                \
        sq += bq;                                                                 \
        mx = bmx > mx ? bmx : mx;                                                 \
        mn = bmn < mn ? bmn : mn;                                                 \
    }                                                                             \
    out[0] = mx; out[1] = mn; out[2] = sum; out[3] = sq;                          \
    return (isfinite(sum) && isfinite(sq) && isfinite(mx) && isfinite(mn)) ? 0 : 1;

static int stats_f32(const float *x, int64_t n, double *out) { FLOAT_BODY(x[i]) }
#ifdef __F16C__
/* F16C: convert each block to float32 eight values at a time, then reduce it. */
static int stats_f16(const uint16_t *h, int64_t n, double *out) {
    float buf[BLOCK];
    float mx = -INFINITY, mn = INFINITY;
    double sum = 0.0, sq = 0.0;
    for (int64_t s = 0; s < n; s += BLOCK) {
        int64_t len = s + BLOCK < n ? BLOCK : n - s;
        int64_t j = 0;
        for (; j + 8 <= len; j += 8)
            _mm256_storeu_ps(buf + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + s + j))));
        for (; j < len; j++)
            buf[j] = f16_to_f32(h[s + j]);
        float bs = 0.f, bq = 0.f, bmx = -INFINITY, bmn = INFINITY;
        #pragma omp simd reduction(+:bs,bq) reduction(max:bmx) reduction(min:bmn)
        for (int64_t i = 0; i < len; i++) {
            float v = buf[i];
            bs += v;
            bq += v * v;
            bmx = v > bmx ? v : bmx;
            bmn = v < bmn ? v : bmn;
        }
        sum += bs;
        sq += bq;
        mx = bmx > mx ? bmx : mx;
        mn = bmn < mn ? bmn : mn;
    }
    out[0] = mx; out[1] = mn; out[2] = sum; out[3] = sq;
    return (isfinite(sum) && isfinite(sq) && isfinite(mx) && isfinite(mn)) ? 0 : 1;
}
#else
static int stats_f16(const uint16_t *x, int64_t n, double *out) { FLOAT_BODY(f16_to_f32(x[i])) }
#endif
static int stats_bf16(const uint16_t *x, int64_t n, double *out) { FLOAT_BODY(bf16_to_f32(x[i])) }

static int stats_f64(const double *x, int64_t n, double *out) {
    double mx = -INFINITY, mn = INFINITY, sum = 0.0, sq = 0.0;
    #pragma omp simd reduction(+:sum,sq) reduction(max:mx) reduction(min:mn)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        sum += v;
        sq += v * v;
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
    }
    out[0] = mx; out[1] = mn; out[2] = sum; out[3] = sq;
    return (isfinite(sum) && isfinite(sq) && isfinite(mx) && isfinite(mn)) ? 0 : 1;
}

/* Integers: exact max/min (as int64, then double), sum and sum of squares in double. */
#define INT_BODY(T)                                                               \
    const T *x = (const T *)p;                                                    \
    int64_t mx = (int64_t)x[0], mn = (int64_t)x[0];                               \
    double sum = 0.0, sq = 0.0;                                                   \
    for (int64_t i = 0; i < n; i++) {                                             \
        int64_t v = (int64_t)x[i];                                                \
        double d = (double)v;                                                     \
        sum += d;                                                                 \
        sq += d * d;                                                              \
        mx = v > mx ? v : mx;                                                     \
        mn = v < mn ? v : mn;                                                     \
    }                                                                             \
    out[0] = (double)mx; out[1] = (double)mn; out[2] = sum; out[3] = sq;          \
    return 0;

static int stats_i8(const void *p, int64_t n, double *out) { INT_BODY(int8_t) }
static int stats_u8(const void *p, int64_t n, double *out) { INT_BODY(uint8_t) }
static int stats_i16(const void *p, int64_t n, double *out) { INT_BODY(int16_t) }
static int stats_i32(const void *p, int64_t n, double *out) { INT_BODY(int32_t) }
static int stats_i64(const void *p, int64_t n, double *out) { INT_BODY(int64_t) }

int tsp_stats(const void *p, int64_t n, int dtype, double *out) {
    if (n <= 0) return -1;
    switch (dtype) {
    case F32: return stats_f32((const float *)p, n, out);
    case F64: return stats_f64((const double *)p, n, out);
    case F16: return stats_f16((const uint16_t *)p, n, out);
    case BF16: return stats_bf16((const uint16_t *)p, n, out);
    case I8: return stats_i8(p, n, out);
    case U8: case BOOL: return stats_u8(p, n, out);
    case I16: return stats_i16(p, n, out);
    case I32: return stats_i32(p, n, out);
    case I64: return stats_i64(p, n, out);
    default: return -1;
    }
}

int tsp_abi_version(void) { return 3; }
