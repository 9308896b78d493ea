/* The C kernels of ts_core.native._kernels (stats.c, compare.c), called by module.c. */
#ifndef TSP_KERNELS_H
#define TSP_KERNELS_H
#include <stdint.h>

/* dtype codes (ts_core/native/__init__.py: F32, F64, ...); compare.c takes F32, F64, F16, BF16 */
enum { TSP_F32 = 0, TSP_F64 = 1, TSP_F16 = 2, TSP_BF16 = 3, TSP_I8 = 4, TSP_U8 = 5, TSP_I16 = 6,
       TSP_I32 = 7, TSP_I64 = 8, TSP_BOOL = 9 };

/* Picks the float loops for this CPU (allow_simd 0: the baseline ones); returns their name. */
const char *tsp_stats_init(int allow_simd);
/* out = [max, min, sum, sum of squares]; 0 all finite, 1 NaN/Inf met, -1 bad dtype or n <= 0;
 * 2 (float64 only): finite values whose sums overflow double, out = [max, min, mean, norm] */
int tsp_stats(const void *p, int64_t n, int dtype, double *out);
/* compare.c: metric accumulators of elements [begin, end); sums[10], counts[11] */
int tsp_compare(const void *g, int gd, const void *t, int td, int64_t begin, int64_t end,
                int64_t chunk_size, double rtol, double atol, int equal_nan, double *sums, int64_t *counts);
/* compare.c: the lane loops for this CPU (avx2 0: the scalar loop only); called by tsp_stats_init */
void tsp_compare_init(int avx2);

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

/* IEEE half -> float without branches (vectorises), exact like F16C's vcvtph2ps: exponent
 * re-biased by one multiply, which also turns half subnormals into float normals; Inf/NaN
 * selected explicitly. */
static inline float f16_to_f32(uint16_t h) {
    uint32_t em = h & 0x7fffu;
    float mag = bits_to_f32(em << 13) * 0x1p112f;
    uint32_t bits = em >= 0x7c00u ? ((em << 13) | 0x7f800000u) : f32_to_bits(mag);
    return bits_to_f32(bits | ((uint32_t)(h & 0x8000u) << 16));
}
#endif
