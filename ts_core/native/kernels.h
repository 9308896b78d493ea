/* The C kernels of ts_core.native._kernels (stats.c, compare.c), called by module.c. */
#ifndef TSP_KERNELS_H
#define TSP_KERNELS_H
#include <stdint.h>

/* dtype codes (ts_core/native/__init__.py: F32, F64, ...); compare.c takes F32 and F64 */
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
#endif
