// x @ E^T for a few rows of x against a float32 table E [vocab, in] (a float model's tied LM head) on CPU: an XLA FFI
// handler (docs/architecture/06-model.md, "Quantized weights", where the float head is measured too).
//
// XLA:CPU lowers that dot by first packing the transpose of the whole table (YNNPACK's packer: ~60% of the head's time
// in a perf profile, on every call), so a step reads and writes the table before its dot reads it again; here each
// table row is read once, in place, and dotted with every row of x. Rows of x from `valid` on (the bucket's padding
// logits rows) are skipped and their outputs set to zero. Units of table rows are shared with XLA's intra-op pool.

#include "cpu_kernel.h"

namespace {

using namespace vllm_jax_native;  // NOLINT: this file's kernel is built on its helpers

constexpr int64_t kRowsPerUnit = 256;  // table rows a task unit covers
constexpr int kStreams = 4;  // table rows read at once
constexpr int64_t kParallelWeights = 1 << 16;  // below this many table entries a call runs on one thread

struct Table {
  const float* x;
  const float* table;
  int64_t rows, in, vocab;
  float* y;
};

// y[r0 .. r0 + RB, v] = x[r] . E[v].
template <int RB>
void table_row(const Table& t, int64_t r0, int64_t v) {
  const float* row = t.table + v * t.in;
  const float* x = t.x + r0 * t.in;
  int64_t i = 0;
  float sums[RB] = {};
#ifdef VLLM_JAX_SIMD
  VecF even[RB], odd[RB];  // two chains of dependent FMAs instead of one
  for (int r = 0; r < RB; ++r) even[r] = odd[r] = vzero();
  for (; i + 2 * kLanes <= t.in; i += 2 * kLanes) {
    const VecF e0 = vload(row + i), e1 = vload(row + i + kLanes);
    for (int r = 0; r < RB; ++r) {
      even[r] = vfma(vload(x + r * t.in + i), e0, even[r]);
      odd[r] = vfma(vload(x + r * t.in + i + kLanes), e1, odd[r]);
    }
  }
  for (; i + kLanes <= t.in; i += kLanes) {
    const VecF e = vload(row + i);
    for (int r = 0; r < RB; ++r) even[r] = vfma(vload(x + r * t.in + i), e, even[r]);
  }
  for (int r = 0; r < RB; ++r) sums[r] = vsum(vadd(even[r], odd[r]));
#endif
  for (; i < t.in; ++i)
    for (int r = 0; r < RB; ++r) sums[r] += x[r * t.in + i] * row[i];
  for (int r = 0; r < RB; ++r) t.y[(r0 + r) * t.vocab + v] = sums[r];
}

#ifdef VLLM_JAX_SIMD
// y[r0 .. r0 + RB, v + s stride] for s < kStreams: that many table rows read at once, each a sequential stream through
// its part of the unit (one stream a core read 17.5 GB/s, 2-8 at once 22-25), each vector of x loaded once for all.
template <int RB>
void table_rows_together(const Table& t, int64_t r0, int64_t v, int64_t stride) {
  const float* x = t.x + r0 * t.in;
  VecF acc[kStreams][RB];
  for (int s = 0; s < kStreams; ++s)
    for (int r = 0; r < RB; ++r) acc[s][r] = vzero();
  int64_t i = 0;
  for (; i + kLanes <= t.in; i += kLanes) {
    VecF e[kStreams];
    for (int s = 0; s < kStreams; ++s) e[s] = vload(t.table + (v + s * stride) * t.in + i);
    for (int r = 0; r < RB; ++r) {
      const VecF xv = vload(x + r * t.in + i);
      for (int s = 0; s < kStreams; ++s) acc[s][r] = vfma(xv, e[s], acc[s][r]);
    }
  }
  for (int s = 0; s < kStreams; ++s) {
    const float* row = t.table + (v + s * stride) * t.in;
    for (int r = 0; r < RB; ++r) {
      float sum = vsum(acc[s][r]);
      for (int64_t j = i; j < t.in; ++j) sum += x[r * t.in + j] * row[j];
      t.y[(r0 + r) * t.vocab + v + s * stride] = sum;
    }
  }
}
#endif

void table_rows(const Table& t, int64_t unit) {
  const int64_t start = unit * kRowsPerUnit, end = std::min(t.vocab, (unit + 1) * kRowsPerUnit);
  int64_t v = start;
#ifdef VLLM_JAX_SIMD
  const int64_t stride = (end - start) / kStreams;
  for (int64_t k = 0; k < stride; ++k) {
    int64_t r = 0;
    for (; r + 2 <= t.rows; r += 2) table_rows_together<2>(t, r, start + k, stride);
    for (; r < t.rows; ++r) table_rows_together<1>(t, r, start + k, stride);
  }
  v = start + kStreams * stride;
#endif
  for (; v < end; ++v) {
    int64_t r = 0;
    for (; r + 4 <= t.rows; r += 4) table_row<4>(t, r, v);
    for (; r + 2 <= t.rows; r += 2) table_row<2>(t, r, v);
    for (; r < t.rows; ++r) table_row<1>(t, r, v);
  }
}

ffi::Error FloatRowsDot(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> valid,
                        ffi::Buffer<ffi::F32> table, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions();
  auto td = table.dimensions();
  if (xd.size() != 2 || td.size() != 2 || xd[1] != td[1]) {
    return ffi::Error::InvalidArgument("float_rows_dot: x [rows, in] and the table [vocab, in]");
  }
  Table t{x.typed_data(), table.typed_data(), std::clamp<int64_t>(valid.typed_data()[0], 0, xd[0]), xd[1], td[0],
          y->typed_data()};
  std::fill(t.y + t.rows * t.vocab, t.y + xd[0] * t.vocab, 0.0f);
  run_units(pool, (t.vocab + kRowsPerUnit - 1) / kRowsPerUnit, t.vocab * t.in >= kParallelWeights,
            [&t](int64_t unit) { table_rows(t, unit); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(VllmJaxFloatRowsDot, FloatRowsDot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
