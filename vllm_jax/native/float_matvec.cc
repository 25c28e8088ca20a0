// x @ W for a few rows of x against float32 linear weights W [in, out] on CPU: an XLA FFI handler
// (docs/architecture/06-model.md, "Quantized weights", where the float kernels are measured too). One call takes
// every weight of the same x (q / k / v, gate / up).
//
// A batch-1 decode step is a stream of weights: each element is read once and used for one FMA a row of x. XLA:CPU's
// dot streamed the default model's layers at 13-20 GB/s on a machine that reads ~32 GB/s on two cores, reading W one
// row after the other: one sequential stream, which a core read at 17.5 GB/s, where 2-8 streams at once read 22-25.
// Here a task's range of W's rows is read as kStreams streams, each through its own part of the range (rows
// i0 + s x stride + t for s < kStreams, all columns), each loaded vector of W used for every row of x while it is in
// a register, y (a few rows of `out` floats) staying in L1 / L2. Rows of x from `valid` on (a bucket's padding
// tokens, which follow the real ones) are skipped and their outputs set to zero.
//
// Work is split into units of contiguous ranges of W's rows (each a partial sum of y), shared with XLA's intra-op pool
// (cpu_kernel.h's run_units); the partials are added into y at the end. The arithmetic is float32 with one FMA chain
// per output element; only the order of the additions differs from XLA's dot.

#include <vector>

#include "cpu_kernel.h"

namespace {

using namespace vllm_jax_native;  // NOLINT: this file's kernel is built on its helpers

constexpr int64_t kStreams = 4;  // rows of W read at once (8 measured the same, 16 slower)
constexpr int64_t kParallelWeights = 1 << 15;  // below this many weights (all of a call's) it runs on one thread
constexpr int64_t kSplits = 2;  // row ranges a weight's work is cut into when the call is threaded

struct Linear {
  const float* x;
  int64_t rows, in, out;
  const float* w;
  float* y;
};

#ifdef VLLM_JAX_SIMD
// Vectors of columns a step computes: 4 x 4 accumulators for four rows fit AVX-512's 32 registers, not AVX2's 16.
constexpr int kStepVectors = kLanes == 16 ? 4 : 2;

// dst[r0 .. r0 + RB, col .. col + V kLanes] += the share of W's rows i + k stride (k < KB) for those columns: each
// vector of W loaded once for the RB rows, RB x V independent chains of FMAs.
template <int KB, int RB, int V>
inline void column_step(const Linear& l, const float* w, int64_t i, int64_t stride, int64_t col, int64_t r0,
                        float* dst) {
  VecF acc[RB][V];
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = vload(dst + (r0 + r) * l.out + col + v * kLanes);
  for (int k = 0; k < KB; ++k) {
    VecF wk[V];
    for (int v = 0; v < V; ++v) wk[v] = vload(w + k * stride * l.out + col + v * kLanes);
    for (int r = 0; r < RB; ++r) {
      const VecF xk = vset1(l.x[(r0 + r) * l.in + i + k * stride]);
      for (int v = 0; v < V; ++v) acc[r][v] = vfma(xk, wk[v], acc[r][v]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < V; ++v) vstore(dst + (r0 + r) * l.out + col + v * kLanes, acc[r][v]);
}

// The columns col .. col + V kLanes of every valid row.
template <int KB, int V>
inline void column_rows(const Linear& l, const float* w, int64_t i, int64_t stride, int64_t col, float* dst) {
  int64_t r = 0;
  for (; r + 4 <= l.rows; r += 4) column_step<KB, 4, V>(l, w, i, stride, col, r, dst);
  for (; r + 2 <= l.rows; r += 2) column_step<KB, 2, V>(l, w, i, stride, col, r, dst);
  for (; r < l.rows; ++r) column_step<KB, 1, V>(l, w, i, stride, col, r, dst);
}
#endif

// dst[r, :] += the share of W's rows i + k stride (k < KB), all columns, for every valid row r.
template <int KB>
void row_block(const Linear& l, int64_t i, int64_t stride, float* dst) {
  const float* w = l.w + i * l.out;
  int64_t col = 0;
#ifdef VLLM_JAX_SIMD
  for (; col + kStepVectors * kLanes <= l.out; col += kStepVectors * kLanes)
    column_rows<KB, kStepVectors>(l, w, i, stride, col, dst);
  for (; col + kLanes <= l.out; col += kLanes) column_rows<KB, 1>(l, w, i, stride, col, dst);
#endif
  for (; col < l.out; ++col) {
    for (int64_t r = 0; r < l.rows; ++r) {
      const float* x = l.x + r * l.in + i;
      float sum = dst[r * l.out + col];
      for (int k = 0; k < KB; ++k) sum += x[k * stride] * w[k * stride * l.out + col];
      dst[r * l.out + col] = sum;
    }
  }
}

// dst [rows, out] += x[:, i0 .. i1] @ W[i0 .. i1, :]: the range read as kStreams streams, rows i0 + s stride + t
// for s < kStreams, then the rows past the last full stride one at a time.
void row_range(const Linear& l, int64_t i0, int64_t i1, float* dst) {
  const int64_t stride = (i1 - i0) / kStreams;
  for (int64_t t = 0; t < stride; ++t) row_block<kStreams>(l, i0 + t, stride, dst);
  for (int64_t i = i0 + kStreams * stride; i < i1; ++i) row_block<1>(l, i, 1, dst);
}

ffi::Error FloatMatvec(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> valid,
                       ffi::RemainingArgs weights, ffi::RemainingRets outputs) {
  auto xd = x.dimensions();
  const size_t n = weights.size();
  if (xd.size() != 2 || n == 0 || outputs.size() != n) {
    return ffi::Error::InvalidArgument("float_matvec: x [rows, in] and one output per weight");
  }
  const int64_t rows = std::clamp<int64_t>(valid.typed_data()[0], 0, xd[0]);
  std::vector<Linear> linears(n);
  int64_t total_weights = 0;
  for (size_t j = 0; j < n; ++j) {
    auto w = weights.get<ffi::Buffer<ffi::F32>>(j);
    auto y = outputs.get<ffi::Buffer<ffi::F32>>(j);
    if (!w.has_value() || !y.has_value()) return ffi::Error::InvalidArgument("float_matvec: float32 buffers only");
    auto wd = w->dimensions();
    if (wd.size() != 2 || wd[0] != xd[1]) return ffi::Error::InvalidArgument("float_matvec: W [in, out], x [rows, in]");
    linears[j] = Linear{x.typed_data(), rows, xd[1], wd[1], w->typed_data(), (*y)->typed_data()};
    std::fill(linears[j].y, linears[j].y + xd[0] * wd[1], 0.0f);
    total_weights += wd[0] * wd[1];
  }
  // Each weight's rows in up to kSplits ranges, a unit each, summed as partials (cpu_kernel.h's run_split_sums);
  // range boundaries on multiples of kStreams, so that only the last range has a tail past the streams.
  const bool parallel = total_weights >= kParallelWeights && rows > 0;
  std::vector<int64_t> splits(n), sizes(n);
  std::vector<float*> ys(n);
  for (size_t j = 0; j < n; ++j) {
    splits[j] = parallel ? std::clamp<int64_t>(linears[j].in / kStreams, 1, kSplits) : 1;
    ys[j] = linears[j].y;
    sizes[j] = rows * linears[j].out;
  }
  run_split_sums(pool, parallel, splits, ys, sizes, [&](size_t j, int64_t k, float* dst) {
    const Linear& l = linears[j];
    const int64_t blocks = l.in / kStreams;
    const int64_t i0 = blocks * k / splits[j] * kStreams;
    const int64_t i1 = k + 1 == splits[j] ? l.in : blocks * (k + 1) / splits[j] * kStreams;
    row_range(l, i0, i1, dst);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(VllmJaxFloatMatvec, FloatMatvec,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
