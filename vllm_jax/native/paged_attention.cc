// Ragged paged attention for a few query rows on CPU: an XLA FFI handler, the `xla` backend's attention when a CPU
// program's step has at most 64 tokens (docs/architecture/07-attention.md, "Attention kernels").
//
// q [T, Hq, D] float32 attends over the float32 cache [layers, blocks, block_size, 2 * Hkv, D] (K and V interleaved
// on the head axis) through each sequence's block table. This step's keys are already written, so every row reads
// its keys from the cache: query row i of sequence s sits at position p = seq_len - q_len + (i - start) and sees
// keys max(0, p - window + 1) .. p (window 0: all). Per (row, KV head) the kernel scores the Hq / Hkv query heads
// of the group against each key once read, takes one softmax (optional soft cap, optional sinks in the
// denominator) and sums the values: the xla backend's arithmetic in float32, in one pass instead of its gathers,
// transposes and log-sum-exp merge. Rows past the live sequences' tokens (a bucket's padding) are zeros.

#include <cmath>
#include <vector>

#include "cpu_kernel.h"

namespace {

using namespace vllm_jax_native;  // NOLINT: this file's kernel is built on its helpers

constexpr int64_t kParallelWork = 1 << 18;  // below this many (row, key, head) products a call runs on one thread
constexpr int64_t kRowsPerThreadSplit = 4;  // fewer live rows than this: split each row's KV heads across units

struct Attention {
  const float* q;
  const float* cache;  // this layer's [blocks, block_size, 2 * Hkv, D]
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* starts;  // query_start_loc
  const float* sinks;  // [Hq] or nullptr
  std::vector<int32_t> row_seq;  // each row's sequence (-1: padding)
  int64_t heads, kv_heads, dim, block_size, table_width, num_blocks, window;
  float sm_scale, soft_cap, v_scale;
  float* out;
};

inline float dot(const float* a, const float* b, int64_t n) {
#ifdef VLLM_JAX_SIMD
  if (n % kLanes == 0) {
    VecF acc = vzero();
    for (int64_t i = 0; i < n; i += kLanes) acc = vfma(vload(a + i), vload(b + i), acc);
    return vsum(acc);
  }
#endif
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void add_scaled(float* dst, const float* src, float scale, int64_t n) {
#ifdef VLLM_JAX_SIMD
  if (n % kLanes == 0) {
    const VecF s = vset1(scale);
    for (int64_t i = 0; i < n; i += kLanes) vstore(dst + i, vfma(s, vload(src + i), vload(dst + i)));
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] += scale * src[i];
}

#ifdef VLLM_JAX_SIMD
template <int NV, class ValueRow>
void weighted_values_in_registers(const float* w, int64_t keys, ValueRow value_row, float* out) {
  VecF even[NV], odd[NV];  // even and odd keys apart: two chains of dependent FMAs
  for (int v = 0; v < NV; ++v) even[v] = odd[v] = vzero();
  int64_t j = 0;
  for (; j + 2 <= keys; j += 2) {
    const float *row0 = value_row(j), *row1 = value_row(j + 1);
    const VecF p0 = vset1(w[j]), p1 = vset1(w[j + 1]);
    for (int v = 0; v < NV; ++v) {
      even[v] = vfma(p0, vload(row0 + v * kLanes), even[v]);
      odd[v] = vfma(p1, vload(row1 + v * kLanes), odd[v]);
    }
  }
  if (j < keys) {
    const float* row = value_row(j);
    const VecF p = vset1(w[j]);
    for (int v = 0; v < NV; ++v) even[v] = vfma(p, vload(row + v * kLanes), even[v]);
  }
  for (int v = 0; v < NV; ++v) vstore(out + v * kLanes, vadd(even[v], odd[v]));
}
#endif

// out [d] = the sum over keys j of w[j] x value_row(j) [d]: one query head's values, its sum kept in registers
// where d is 1, 2, 4 or 8 vectors (summed through memory key by key, the value pass took ~3x longer).
template <class ValueRow>
void weighted_values(const float* w, int64_t keys, ValueRow value_row, int64_t d, float* out) {
#ifdef VLLM_JAX_SIMD
  switch (d % kLanes == 0 ? d / kLanes : 0) {
    case 1: return weighted_values_in_registers<1>(w, keys, value_row, out);
    case 2: return weighted_values_in_registers<2>(w, keys, value_row, out);
    case 4: return weighted_values_in_registers<4>(w, keys, value_row, out);
    case 8: return weighted_values_in_registers<8>(w, keys, value_row, out);
    default: break;
  }
#endif
  std::fill(out, out + d, 0.0f);
  for (int64_t j = 0; j < keys; ++j) add_scaled(out, value_row(j), w[j], d);
}

// Turns one query head's scores into softmax weights in place (before the division) -> their sum, the denominator.
float softmax_weights(float* sc, int64_t keys, const float* sink) {
  float m = -1e30f;  // the xla backend's MASKED: a row with no keys stays finite
  for (int64_t j = 0; j < keys; ++j) m = std::max(m, sc[j]);
  if (sink != nullptr) m = std::max(m, *sink);
  float l = sink != nullptr ? std::exp(*sink - m) : 0.0f;
  int64_t j = 0;
#ifdef VLLM_JAX_SIMD
  const VecF max = vset1(m);
  VecF sum = vzero();
  for (; j + kLanes <= keys; j += kLanes) {
    const VecF e = vexp_nonpositive(vload(sc + j) - max);
    vstore(sc + j, e);
    sum = sum + e;
  }
  l += vsum(sum);
#endif
  for (; j < keys; ++j) {
    sc[j] = std::exp(sc[j] - m);
    l += sc[j];
  }
  return l;
}

// The cache rows a row reads (one per key, 2 Hkv D floats: K and V of every KV head) come from memory each step,
// past the caches that the layers' weights stream through, at an address the block table picks: asked for
// kKeysAhead keys before the scores need them (K and V of the KV heads served, so the value pass finds them in cache
// too). Without it the first loads of each key stalled for ~80% of the kernel's time in a perf profile of a batch-1
// decode step.
constexpr int64_t kKeysAhead = 8;
inline void prefetch_floats(const float* row, int64_t floats) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < floats * static_cast<int64_t>(sizeof(float)); b += 64) __builtin_prefetch(bytes + b);
}

// One live row against KV heads h0 .. h1 and their groups of query heads: one pass over the row's keys for the
// scores, one over its values for the sums, each cache row read once for all those heads.
void row_heads(const Attention& a, int64_t row, int64_t h0, int64_t h1) {
  const int64_t s = a.row_seq[row];
  const int64_t q_len = a.starts[s + 1] - a.starts[s];
  // clamped to what the table can address (as XLA's gathers clamp), so inconsistent inputs never read out of bounds
  const int64_t pos = std::min(a.seq_lens[s] - q_len + (row - a.starts[s]), a.table_width * a.block_size - 1);
  const int64_t first = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  const int64_t keys = std::max<int64_t>(pos + 1 - first, 0);
  const int64_t group = a.heads / a.kv_heads, d = a.dim, row_stride = 2 * a.kv_heads * d;
  const int64_t q0 = h0 * group, nq = (h1 - h0) * group;  // the query heads served
  const int32_t* table = a.block_tables + s * a.table_width;
  std::vector<const float*> rows(keys);  // each key's cache row, looked up once
  for (int64_t j = 0; j < keys; ++j) {
    const int64_t key = first + j;
    const int64_t block = std::clamp<int64_t>(table[key / a.block_size], 0, a.num_blocks - 1);
    rows[j] = a.cache + (block * a.block_size + key % a.block_size) * row_stride;
  }
  std::vector<float> scores(nq * std::max<int64_t>(keys, 1));
  const float* q = a.q + (row * a.heads + q0) * d;
  for (int64_t j = 0; j < keys; ++j) {
    if (j + kKeysAhead < keys) prefetch_floats(rows[j + kKeysAhead] + 2 * h0 * d, 2 * (h1 - h0) * d);
    const float* kv = rows[j];
    for (int64_t h = 0; h < nq; ++h) {
      float score = dot(q + h * d, kv + 2 * (h0 + h / group) * d, d) * a.sm_scale;
      if (a.soft_cap > 0.0f) score = a.soft_cap * std::tanh(score / a.soft_cap);
      scores[h * keys + j] = score;
    }
  }
  std::vector<float> norms(nq);
  for (int64_t h = 0; h < nq; ++h) {
    const float* sink = a.sinks != nullptr ? a.sinks + q0 + h : nullptr;
    norms[h] = a.v_scale / std::max(softmax_weights(scores.data() + h * keys, keys, sink), 1e-30f);
  }
  float* out = a.out + (row * a.heads + q0) * d;
  for (int64_t h = 0; h < nq; ++h) {
    const int64_t value_offset = (2 * (h0 + h / group) + 1) * d;
    weighted_values(scores.data() + h * keys, keys, [&](int64_t j) { return rows[j] + value_offset; },
                    d, out + h * d);
    for (int64_t i = 0; i < d; ++i) out[h * d + i] *= norms[h];
  }
}

ffi::Error PagedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> kv_cache,
                          ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> block_tables, ffi::Buffer<ffi::S32> seq_lens,
                          ffi::Buffer<ffi::S32> query_start_loc, ffi::Buffer<ffi::S32> num_seqs,
                          ffi::Buffer<ffi::S32> window, ffi::Buffer<ffi::F32> sinks, ffi::ResultBuffer<ffi::F32> out,
                          float sm_scale, float soft_cap, float v_scale, bool has_sinks) {
  auto qd = q.dimensions();
  auto cd = kv_cache.dimensions();
  auto td = block_tables.dimensions();
  if (qd.size() != 3 || cd.size() != 5 || td.size() != 2 || cd[4] != qd[2] || cd[3] % 2 != 0 ||
      qd[1] % (cd[3] / 2) != 0 || seq_lens.dimensions()[0] != td[0] ||
      query_start_loc.dimensions()[0] != td[0] + 1) {
    return ffi::Error::InvalidArgument("paged_attention: q [T, Hq, D], cache [L, blocks, bs, 2 Hkv, D], "
                                       "tables [S, W]");
  }
  Attention a;
  a.heads = qd[1];
  a.dim = qd[2];
  a.kv_heads = cd[3] / 2;
  a.block_size = cd[2];
  a.num_blocks = cd[1];
  a.table_width = td[1];
  const int64_t rows = qd[0];
  const int64_t layer_elems = cd[1] * cd[2] * cd[3] * cd[4];
  const int64_t l = std::clamp<int64_t>(layer.typed_data()[0], 0, cd[0] - 1);
  a.q = q.typed_data();
  a.cache = kv_cache.typed_data() + l * layer_elems;
  a.block_tables = block_tables.typed_data();
  a.seq_lens = seq_lens.typed_data();
  a.starts = query_start_loc.typed_data();
  a.sinks = has_sinks ? sinks.typed_data() : nullptr;
  a.window = window.typed_data()[0];
  a.sm_scale = sm_scale;
  a.soft_cap = soft_cap;
  a.v_scale = v_scale;
  a.out = out->typed_data();
  const int64_t seqs = std::clamp<int64_t>(num_seqs.typed_data()[0], 0, td[0]);
  a.row_seq.assign(rows, -1);
  std::vector<int64_t> live_rows;
  int64_t work = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t begin = std::clamp<int64_t>(a.starts[s], 0, rows);
    const int64_t end = std::clamp<int64_t>(a.starts[s + 1], begin, rows);
    for (int64_t r = begin; r < end; ++r) {
      a.row_seq[r] = static_cast<int32_t>(s);
      live_rows.push_back(r);
    }
    work += (end - begin) * a.seq_lens[s];
  }
  std::fill(a.out, a.out + rows * a.heads * a.dim, 0.0f);
  // A few rows: a unit per (row, KV head), so the threads share even one row; more: a unit per row, all its heads
  // in one pass over its cache rows.
  const int64_t live = static_cast<int64_t>(live_rows.size());
  const int64_t split = live < kRowsPerThreadSplit ? a.kv_heads : 1;
  run_units(pool, live * split, work * a.heads * a.dim >= kParallelWork, [&](int64_t unit) {
    const int64_t row = live_rows[unit / split], h0 = split == 1 ? 0 : unit % split;
    row_heads(a, row, h0, split == 1 ? a.kv_heads : h0 + 1);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(VllmJaxPagedAttention, PagedAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("sm_scale")
                                  .Attr<float>("soft_cap")
                                  .Attr<float>("v_scale")
                                  .Attr<bool>("has_sinks"));
