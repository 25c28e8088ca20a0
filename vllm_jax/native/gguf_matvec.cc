// x @ W for a few rows of x against W kept in GGUF blocks (vllm_jax/model/grouped_quant.py's layout), reading the
// blocks directly: XLA FFI handlers for the CPU (docs/architecture/06-model.md, "Quantized weights").
// VllmJaxGgufMatvec takes one or more linear weights against the same x (q / k / v, gate / up: one call),
// VllmJaxGgufRowsDot a table whose rows are the outputs (the tied LM head).
//
// W [in, out] is grouped along `in`: values uint8 [in / 2, out] (4-bit formats: byte j of group g holds row
// 32g + j in its low nibble and row 32g + 16 + j in its high one) or int8 [in, out] (Q8_0, Q6_K); scales (and
// Q4_1 / Q4_K mins) [in / group, out], float16 or float32. A group's share of y[r, o] is
//     d[g, o] * sum_j x[r, j] q[j, o]  +  m[g, o] * sum_j x[r, j]
// (Q4_0's offset of 8 is a min of -8 d), so the 4-bit values are converted once per tile and column and the
// scale is applied once per group: no float copy of W is ever written. The arithmetic is float32, as the XLA
// path's dot of the dequantized weight; only the order of the additions differs.
//
// Rows of x from `valid` on (an int32 operand: a bucket's padding tokens, which follow the real ones) are skipped and
// their outputs set to zero.
//
// Work is split into units (a weight's ranges of groups; a table's runs of rows), taken from a shared counter by the
// calling thread and by helper tasks on XLA's intra-op thread pool; the caller runs whatever no helper has taken,
// so a pool that never runs a task (or runs it late) cannot stall the call.

#include <vector>

#include "cpu_kernel.h"

namespace {

using namespace vllm_jax_native;  // NOLINT: this file's kernels are built on its helpers

enum Format : int32_t { kQ8_0 = 0, kQ4_0 = 1, kQ4_1 = 2, kQ4_K = 3, kQ6_K = 4 };
bool is_packed(Format fmt) { return fmt == kQ4_0 || fmt == kQ4_1 || fmt == kQ4_K; }
bool has_min(Format fmt) { return fmt == kQ4_1 || fmt == kQ4_K; }
int64_t group_rows_of(Format fmt) { return fmt == kQ6_K ? 16 : 32; }

constexpr int64_t kTile = 64;  // output columns computed together (a group's rows of them: one pass)
constexpr int64_t kParallelWeights = 1 << 15;  // below this many weights a call runs on one thread
constexpr int64_t kSplits = 4;  // group ranges a weight's work is cut into when the call is threaded

struct Problem {
  const float* x;
  int64_t rows, in, out, groups, group_rows;
  Format fmt;
  const uint8_t* values;
  const void* scale;
  const void* minimum;  // nullptr: none (or Q4_0's implicit -8 d)
  bool half_scales;
  const float* xsum;  // [rows, groups]: each group's sum of x (for the min term)
  float* y;
};

// dst[w] = the group's scales (or mins) for columns col .. col + width.
inline void load_row(const Problem& p, const void* base, int64_t g, int64_t col, int64_t width, float* dst) {
  int64_t offset = g * p.out + col;
  if (p.half_scales) {
    const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
    int64_t w = 0;
#if defined(__F16C__)
    for (; w + 8 <= width; w += 8) {
      _mm256_storeu_ps(dst + w, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + w))));
    }
#endif
    for (; w < width; ++w) dst[w] = half_to_float(s[w]);
  } else {
    std::memcpy(dst, static_cast<const float*>(base) + offset, width * sizeof(float));
  }
}

#ifdef VLLM_JAX_SIMD
constexpr int64_t kVectors = kTile / kLanes;

// kLanes scales (or mins) of a [groups, out] array from `offset`, float16 or float32.
inline VecF scales_at(const Problem& p, const void* base, int64_t offset) {
  return p.half_scales ? vload_half(static_cast<const uint16_t*>(base) + offset)
                       : vload(static_cast<const float*>(base) + offset);
}

// dst[r0 .. r0 + RB, col .. col + kTile] += group g's share, d x (x . q) + m x sum(x) per column, the sums kept in
// registers until one add into dst (through arrays on the stack, that epilogue cost ~12% of the kernel's time).
template <int RB, bool Packed>
void vector_tile(const Problem& p, int64_t r0, int64_t g, int64_t col, float* dst) {
  VecF acc[RB][kVectors];
  for (int r = 0; r < RB; ++r)
    for (int64_t v = 0; v < kVectors; ++v) acc[r][v] = vzero();
  const int64_t steps = Packed ? p.group_rows / 2 : p.group_rows;
  const uint8_t* src = p.values + g * steps * p.out + col;
  const float* x = p.x + r0 * p.in + g * p.group_rows;
  // The next group's rows of this tile, asked for by hand: they are `out` bytes apart, a stride the hardware's
  // prefetchers did not follow in time (10-15% faster from memory, the default model's shapes and 4096 x 4096).
  if (g + 1 < p.groups)
    for (int64_t j = 0; j < steps; ++j) __builtin_prefetch(src + (steps + j) * p.out);
  for (int64_t j = 0; j < steps; ++j, src += p.out) {
    VecF xa[RB], xb[RB];
    for (int r = 0; r < RB; ++r) {
      xa[r] = vset1(x[r * p.in + j]);
      if (Packed) xb[r] = vset1(x[r * p.in + 16 + j]);
    }
    for (int64_t v = 0; v < kVectors; ++v) {
      if (Packed) {
        const auto q = widen_u8(src + v * kLanes);
        const VecF lo = low_nibbles(q), hi = high_nibbles(q);
        for (int r = 0; r < RB; ++r) acc[r][v] = vfma(xb[r], hi, vfma(xa[r], lo, acc[r][v]));
      } else {
        const VecF q = load_i8(src + v * kLanes);
        for (int r = 0; r < RB; ++r) acc[r][v] = vfma(xa[r], q, acc[r][v]);
      }
    }
  }
  const bool with_min = p.minimum != nullptr || p.fmt == kQ4_0;
  for (int64_t v = 0; v < kVectors; ++v) {
    const int64_t offset = g * p.out + col + v * kLanes;
    const VecF d = scales_at(p, p.scale, offset);
    const VecF m = p.minimum != nullptr ? scales_at(p, p.minimum, offset) : vmul(vset1(-8.0f), d);
    for (int r = 0; r < RB; ++r) {
      float* out = dst + (r0 + r) * p.out + col + v * kLanes;
      VecF sum = vload(out);
      if (with_min) sum = vfma(m, vset1(p.xsum[(r0 + r) * p.groups + g]), sum);
      vstore(out, vfma(d, acc[r][v], sum));
    }
  }
}
#endif

// part[r][w] = x . q over group g's rows for the tile's columns, plain loops (a CPU without the vector helpers).
template <int RB>
inline void plain_tile(const Problem& p, bool packed, const float* x, int64_t g, int64_t col,
                       float (&part)[RB][kTile]) {
  float lo[kTile], hi[kTile];
  for (int r = 0; r < RB; ++r)
    for (int64_t w = 0; w < kTile; ++w) part[r][w] = 0.0f;
  const int64_t steps = packed ? p.group_rows / 2 : p.group_rows;
  for (int64_t j = 0; j < steps; ++j) {
    if (packed) {
      const uint8_t* src = p.values + (g * steps + j) * p.out + col;
      for (int64_t w = 0; w < kTile; ++w) {
        lo[w] = static_cast<float>(src[w] & 15);
        hi[w] = static_cast<float>(src[w] >> 4);
      }
    } else {
      const int8_t* src = reinterpret_cast<const int8_t*>(p.values) + (g * steps + j) * p.out + col;
      for (int64_t w = 0; w < kTile; ++w) lo[w] = static_cast<float>(src[w]);
    }
    for (int r = 0; r < RB; ++r) {
      const float xa = x[r * p.in + g * p.group_rows + j];
      const float xb = packed ? x[r * p.in + g * p.group_rows + 16 + j] : 0.0f;
      for (int64_t w = 0; w < kTile; ++w) {
        part[r][w] += xa * lo[w];
        if (packed) part[r][w] += xb * hi[w];
      }
    }
  }
}

// The same for a narrower last tile, one column at a time.
template <int RB>
inline void group_columns(const Problem& p, bool packed, const float* x, int64_t g, int64_t col, int64_t width,
                          float (&part)[RB][kTile]) {
  for (int r = 0; r < RB; ++r)
    for (int64_t w = 0; w < width; ++w) {
      float sum = 0.0f;
      for (int64_t j = 0; j < p.group_rows; ++j) {
        float q;
        if (packed) {
          const uint8_t b = p.values[(g * 16 + j % 16) * p.out + col + w];
          q = static_cast<float>(j < 16 ? b & 15 : b >> 4);
        } else {
          q = static_cast<float>(reinterpret_cast<const int8_t*>(p.values)[(g * p.group_rows + j) * p.out + col + w]);
        }
        sum += x[r * p.in + g * p.group_rows + j] * q;
      }
      part[r][w] = sum;
    }
}

// dst[r0 .. r0 + RB, col .. col + width] += group g's share (dst: [rows, out]).
template <int RB>
void tile(const Problem& p, int64_t r0, int64_t g, int64_t col, int64_t width, float* dst) {
  const bool packed = is_packed(p.fmt);
  alignas(64) float part[RB][kTile];
  alignas(64) float d[kTile], m[kTile];
  const bool with_min = p.minimum != nullptr || p.fmt == kQ4_0;
  const float* x = p.x + r0 * p.in;
  if (width == kTile) {
    plain_tile<RB>(p, packed, x, g, col, part);
  } else {
    group_columns<RB>(p, packed, x, g, col, width, part);
  }
  load_row(p, p.scale, g, col, width, d);
  if (p.minimum != nullptr) {
    load_row(p, p.minimum, g, col, width, m);
  } else if (p.fmt == kQ4_0) {
    for (int64_t w = 0; w < width; ++w) m[w] = -8.0f * d[w];
  }
  for (int r = 0; r < RB; ++r) {
    const float xs = with_min ? p.xsum[(r0 + r) * p.groups + g] : 0.0f;
    float* out = dst + (r0 + r) * p.out + col;
    for (int64_t w = 0; w < width; ++w) out[w] += d[w] * part[r][w] + (with_min ? m[w] * xs : 0.0f);
  }
}

// dst[r0 .. r0 + RB, :] += group g's share, tile by tile.
template <int RB>
void group_tiles(const Problem& p, int64_t r0, int64_t g, float* dst) {
  int64_t col = 0;
#ifdef VLLM_JAX_SIMD
  const int64_t full = p.out / kTile * kTile;
  if (is_packed(p.fmt)) {
    for (; col < full; col += kTile) vector_tile<RB, true>(p, r0, g, col, dst);
  } else {
    for (; col < full; col += kTile) vector_tile<RB, false>(p, r0, g, col, dst);
  }
#endif
  for (; col < p.out; col += kTile) tile<RB>(p, r0, g, col, std::min(kTile, p.out - col), dst);
}

// dst [rows, out] += the share of groups g0 .. g1, read in memory order: group by group (16 or 32 rows of W, one
// contiguous block), each group's column tiles in turn. Reading a column tile down all the groups instead strides
// through memory by a row of W per 64 bytes: a 4096 x 14336 Q4_1 matrix (37 MB, past the caches) took 2.3-2.6 ms
// that way on two cores against 1.4-1.6 ms in memory order (the default model's small matrices: no difference).
void group_range(const Problem& p, int64_t g0, int64_t g1, float* dst) {
  for (int64_t g = g0; g < g1; ++g) {
    int64_t r = 0;
    for (; r + 4 <= p.rows; r += 4) group_tiles<4>(p, r, g, dst);
    for (; r + 2 <= p.rows; r += 2) group_tiles<2>(p, r, g, dst);
    for (; r < p.rows; ++r) group_tiles<1>(p, r, g, dst);
  }
}

// Each group's sum of x over its rows, [rows, groups] (for the min term of Q4_0 / Q4_1 / Q4_K).
std::vector<float> group_sums(const float* x, int64_t rows, int64_t in, int64_t group_rows) {
  const int64_t groups = in / group_rows;
  std::vector<float> sums(rows * groups);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int64_t j = 0; j < group_rows; ++j) sum += x[r * in + g * group_rows + j];
      sums[r * groups + g] = sum;
    }
  return sums;
}

// The problem of either handler from its buffers: `table` E [out, in] (grouped along in) or W [in, out].
// Rows of x at and past `valid` (a bucket's padding) are not computed: their outputs are zeros.
ffi::Error parse(const ffi::Buffer<ffi::F32>& x, const ffi::AnyBuffer& values, const ffi::AnyBuffer& scale,
                 const ffi::AnyBuffer& minimum, const ffi::Buffer<ffi::S32>& valid, float* y, int32_t fmt, bool table,
                 Problem& p, std::vector<float>& sums) {
  auto xd = x.dimensions();
  auto vd = values.dimensions();
  auto sd = scale.dimensions();
  if (xd.size() != 2 || vd.size() != 2 || sd.size() != 2 || fmt < kQ8_0 || fmt > kQ6_K) {
    return ffi::Error::InvalidArgument("gguf kernels: x [rows, in], values and scale 2-d, fmt 0..4");
  }
  p.fmt = static_cast<Format>(fmt);
  p.rows = std::clamp<int64_t>(valid.typed_data()[0], 0, xd[0]);
  p.in = xd[1];
  p.out = table ? vd[0] : vd[1];
  p.groups = table ? sd[1] : sd[0];
  p.group_rows = group_rows_of(p.fmt);
  const int64_t value_rows = is_packed(p.fmt) ? p.in / 2 : p.in;
  const bool shapes_match = p.groups * p.group_rows == p.in && (table ? vd[1] : vd[0]) == value_rows &&
                            (table ? sd[0] : sd[1]) == p.out;
  if (!shapes_match) return ffi::Error::InvalidArgument("gguf kernels: values / scale shapes do not match x's");
  p.x = x.typed_data();
  p.values = static_cast<const uint8_t*>(values.untyped_data());
  p.scale = scale.untyped_data();
  p.half_scales = scale.element_type() == ffi::DataType::F16;
  p.minimum = has_min(p.fmt) ? minimum.untyped_data() : nullptr;
  p.y = y;
  std::fill(p.y + p.rows * p.out, p.y + xd[0] * p.out, 0.0f);
  if (has_min(p.fmt) || p.fmt == kQ4_0) {
    sums = group_sums(p.x, p.rows, p.in, p.group_rows);
    p.xsum = sums.data();
  }
  return ffi::Error::Success();
}

// Several linear weights against the same x (q / k / v, gate / up) in one call: weights holds (values, scale, min)
// per weight, outputs one y each, fmts one format each. Their column tiles are one pool of units.
ffi::Error GgufMatvec(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> valid,
                      ffi::RemainingArgs weights, ffi::RemainingRets outputs, ffi::Span<const int32_t> fmts) {
  const size_t n = fmts.size();
  if (n == 0 || weights.size() != 3 * n || outputs.size() != n) {
    return ffi::Error::InvalidArgument("gguf_matvec: three buffers (values, scale, min) and one output per format");
  }
  std::vector<Problem> problems(n);
  std::vector<std::vector<float>> sums(n);
  int64_t total_weights = 0;
  for (size_t i = 0; i < n; ++i) {
    auto values = weights.get<ffi::AnyBuffer>(3 * i);
    auto scale = weights.get<ffi::AnyBuffer>(3 * i + 1);
    auto minimum = weights.get<ffi::AnyBuffer>(3 * i + 2);
    auto y = outputs.get<ffi::AnyBuffer>(i);
    if (!values.has_value() || !scale.has_value() || !minimum.has_value() || !y.has_value()) {
      return ffi::Error::InvalidArgument("gguf_matvec: a weight's buffers or its output are missing");
    }
    ffi::Error error = parse(x, *values, *scale, *minimum, valid, static_cast<float*>((*y)->untyped_data()), fmts[i],
                             /*table=*/false, problems[i], sums[i]);
    if (error.failure()) return error;
    total_weights += problems[i].in * problems[i].out;
  }
  // Each weight's groups in up to kSplits contiguous ranges, a unit each, summed as partials (cpu_kernel.h's
  // run_split_sums).
  const bool parallel = total_weights >= kParallelWeights;
  std::vector<int64_t> splits(n), sizes(n);
  std::vector<float*> ys(n);
  for (size_t i = 0; i < n; ++i) {
    const Problem& p = problems[i];
    splits[i] = parallel ? std::min<int64_t>(kSplits, p.groups) : 1;
    ys[i] = p.y;
    sizes[i] = p.rows * p.out;
    std::fill(p.y, p.y + sizes[i], 0.0f);
  }
  run_split_sums(pool, parallel, splits, ys, sizes, [&](size_t i, int64_t k, float* dst) {
    const Problem& p = problems[i];
    group_range(p, p.groups * k / splits[i], p.groups * (k + 1) / splits[i], dst);
  });
  return ffi::Error::Success();
}

// ---- rows of a table: y[r, v] = x[r] . E[v], E [vocab, in] grouped along `in` -------------------------------

constexpr int64_t kTableRows = 128;  // table rows a task unit covers

inline float group_scale(const Problem& p, const void* base, int64_t v, int64_t g) {
  const int64_t i = v * p.groups + g;
  return p.half_scales ? scalar_half(static_cast<const uint16_t*>(base)[i]) : static_cast<const float*>(base)[i];
}

// One table row against RB rows of x: each group's x . q, scaled by its d, plus its min times the group's x sum.
template <int RB>
void plain_table_row(const Problem& p, int64_t r0, int64_t v) {
  const bool packed = is_packed(p.fmt);
  const uint8_t* row = p.values + v * (packed ? p.in / 2 : p.in);
  const float* x = p.x + r0 * p.in;
  float acc[RB] = {}, mins[RB] = {};
  for (int64_t g = 0; g < p.groups; ++g) {
    float part[RB] = {};
    for (int64_t j = 0; j < p.group_rows; ++j) {
      float q;
      if (packed) {
        const uint8_t b = row[g * 16 + j % 16];
        q = static_cast<float>(j < 16 ? b & 15 : b >> 4);
      } else {
        q = static_cast<float>(reinterpret_cast<const int8_t*>(row)[g * p.group_rows + j]);
      }
      for (int r = 0; r < RB; ++r) part[r] += x[r * p.in + g * p.group_rows + j] * q;
    }
    const float d = group_scale(p, p.scale, v, g);
    for (int r = 0; r < RB; ++r) acc[r] += d * part[r];
    if (p.minimum != nullptr || p.fmt == kQ4_0) {
      const float m = p.minimum != nullptr ? group_scale(p, p.minimum, v, g) : -8.0f * d;
      for (int r = 0; r < RB; ++r) mins[r] += m * p.xsum[(r0 + r) * p.groups + g];
    }
  }
  for (int r = 0; r < RB; ++r) p.y[(r0 + r) * p.out + v] = acc[r] + mins[r];
}

#ifdef VLLM_JAX_SIMD
// Group g's x . q for RB rows of x, one vector each (its lanes summed later).
template <int RB, bool Packed>
inline void group_dot(const Problem& p, const uint8_t* row, const float* x, int64_t g, VecF (&part)[RB]) {
  for (int r = 0; r < RB; ++r) part[r] = vzero();
  if (Packed) {
    for (int64_t c = 0; c < 16; c += kLanes) {
      const auto q = widen_u8(row + g * 16 + c);
      const VecF lo = low_nibbles(q), hi = high_nibbles(q);
      for (int r = 0; r < RB; ++r) {
        const float* xg = x + r * p.in + g * 32 + c;
        part[r] = vfma(vload(xg + 16), hi, vfma(vload(xg), lo, part[r]));
      }
    }
  } else {
    for (int64_t c = 0; c < p.group_rows; c += kLanes) {
      const VecF q = load_i8(row + g * p.group_rows + c);
      for (int r = 0; r < RB; ++r) part[r] = vfma(vload(x + r * p.in + g * p.group_rows + c), q, part[r]);
    }
  }
}

// plain_table_row with the vector helpers, two groups at a time into two sums: one chain of dependent FMAs through
// the row's groups bounded it (14 Gw/s a core on the default model's Q8_0 table, in cache).
template <int RB, bool Packed>
void vector_table_row(const Problem& p, int64_t r0, int64_t v) {
  const uint8_t* row = p.values + v * (Packed ? p.in / 2 : p.in);
  const float* x = p.x + r0 * p.in;
  VecF even[RB], odd[RB], part[RB];
  for (int r = 0; r < RB; ++r) even[r] = odd[r] = vzero();
  int64_t g = 0;
  for (; g + 2 <= p.groups; g += 2) {
    group_dot<RB, Packed>(p, row, x, g, part);
    const VecF d0 = vset1(group_scale(p, p.scale, v, g));
    for (int r = 0; r < RB; ++r) even[r] = vfma(d0, part[r], even[r]);
    group_dot<RB, Packed>(p, row, x, g + 1, part);
    const VecF d1 = vset1(group_scale(p, p.scale, v, g + 1));
    for (int r = 0; r < RB; ++r) odd[r] = vfma(d1, part[r], odd[r]);
  }
  if (g < p.groups) {
    group_dot<RB, Packed>(p, row, x, g, part);
    const VecF d = vset1(group_scale(p, p.scale, v, g));
    for (int r = 0; r < RB; ++r) even[r] = vfma(d, part[r], even[r]);
  }
  float mins[RB] = {};
  if (p.minimum != nullptr || p.fmt == kQ4_0) {
    for (int64_t k = 0; k < p.groups; ++k) {
      const float m = p.minimum != nullptr ? group_scale(p, p.minimum, v, k) : -8.0f * group_scale(p, p.scale, v, k);
      for (int r = 0; r < RB; ++r) mins[r] += m * p.xsum[(r0 + r) * p.groups + k];
    }
  }
  for (int r = 0; r < RB; ++r) p.y[(r0 + r) * p.out + v] = vsum(vadd(even[r], odd[r])) + mins[r];
}
#endif

template <int RB>
void table_row(const Problem& p, int64_t r0, int64_t v) {
#ifdef VLLM_JAX_SIMD
  is_packed(p.fmt) ? vector_table_row<RB, true>(p, r0, v) : vector_table_row<RB, false>(p, r0, v);
#else
  plain_table_row<RB>(p, r0, v);
#endif
}

void table_rows(const Problem& p, int64_t unit) {
  const int64_t end = std::min(p.out, (unit + 1) * kTableRows);
  for (int64_t v = unit * kTableRows; v < end; ++v) {
    int64_t r = 0;
    for (; r + 4 <= p.rows; r += 4) table_row<4>(p, r, v);
    for (; r + 2 <= p.rows; r += 2) table_row<2>(p, r, v);
    for (; r < p.rows; ++r) table_row<1>(p, r, v);
  }
}

ffi::Error GgufRowsDot(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> valid, ffi::AnyBuffer values,
                       ffi::AnyBuffer scale, ffi::AnyBuffer minimum, ffi::ResultBuffer<ffi::F32> y, int32_t fmt) {
  Problem p{};
  std::vector<float> sums;
  ffi::Error error = parse(x, values, scale, minimum, valid, y->typed_data(), fmt, /*table=*/true, p, sums);
  if (error.failure()) return error;
  run_units(pool, (p.out + kTableRows - 1) / kTableRows, p.in * p.out >= kParallelWeights,
            [&p](int64_t unit) { table_rows(p, unit); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(VllmJaxGgufMatvec, GgufMatvec,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<ffi::Span<const int32_t>>("fmts"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(VllmJaxGgufRowsDot, GgufRowsDot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("fmt"));
