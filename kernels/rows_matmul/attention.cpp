// Attention of a few query rows over a KV cache, fused: decode and verify steps (1-16 rows).
// MLX's CPU backend composes attention from a dozen ops per layer (a mask, two batched products,
// a softmax, copies of the cache's strided views), about 0.2 ms a layer at any context; here each
// query row reads its keys and values once, straight from the cache's buffer.
//
// Each row is computed alone, over its allowed keys in ascending order, so a row's output is bit for
// bit the same whatever rows came with it: a verify row equals the plain step at its position. The
// rows of a key head's group read each tile of the cache together, and the cores share the groups.

#include "attention_job.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "vectors.h"
#include "workers.h"

namespace metrale {
namespace {

float dot(const float* a, const float* b, int D) {
  int d = 0;
  vf acc = vf{};
  for (; d + kLanes <= D; d += kLanes) acc = multiply_add(load(a + d), load(b + d), acc);
  float s = lane_total(acc);
  for (; d < D; ++d) s += a[d] * b[d];  // unfused: contract off
  return s;
}

// The dot products of q with kLanes keys from t, into one vector: each key's sum in the same order
// as dot() (its lanes pairwise), so a score does not depend on whether a block or dot() made it.
inline vf block_scores(const float* q, const View<float>& k, int b, int kvh, int t, int D) {
  vf acc[kLanes];
#pragma GCC unroll 16
  for (int j = 0; j < kLanes; ++j) acc[j] = vf{};
  int d = 0;
  for (; d + kLanes <= D; d += kLanes) {  // the accumulators stay in registers: every loop over them unrolled
    vf qv = load(q + d);
#pragma GCC unroll 16
    for (int j = 0; j < kLanes; ++j) acc[j] = multiply_add(qv, load(k.at(b, kvh, t + j) + d), acc[j]);
  }
  lane_sums<kLanes / 2, kLanes>(acc);
  if (d < D) {  // a head size that is no multiple of the vector: the rest as dot() adds it
    float sums[kLanes];
    __builtin_memcpy(sums, &acc[0], sizeof sums);
    for (int j = 0; j < kLanes; ++j) {
      const float* key = k.at(b, kvh, t + j);
      for (int e = d; e < D; ++e) sums[j] += q[e] * key[e];
    }
    __builtin_memcpy(&acc[0], sums, sizeof sums);
  }
  return acc[0];
}

// out += p * v, D floats.
void add_scaled(float* out, const float* v, float p, int D) {
  int d = 0;
  vf pv = vf{} + p;
  for (; d + kLanes <= D; d += kLanes) store(out + d, multiply_add(pv, load(v + d), load(out + d)));
  for (; d < D; ++d) out[d] += p * v[d];
}

constexpr float kHidden = -std::numeric_limits<float>::infinity();
constexpr int kTile = 64;  // keys whose keys (then values) stay in L1 while every query of a group reads them

// One query row of a unit: where it reads and writes, and what it has summed so far.
struct Query {
  const float* q;
  const bool* allowed;  // null: no mask
  int limit;            // it sees keys [0, limit) (where allowed)
  float* out;
  float* scores;  // [S]: scores, then probabilities
  float* sums;    // [2 D]: the values' even and odd positions
  float top = kHidden, total = 0.0f;
};

// Scores of the keys in [t0, t1) (kHidden where hidden): blocks of kLanes from 0 as far as the row's
// limit allows, single keys after it, so a score is the same whatever tile or rows came with it.
void tile_scores(const Job& j, Query& r, int b, int kvh, int t0, int t1) {
  int end = std::min(t1, r.limit), whole = r.limit / kLanes * kLanes;
  vf top = vf{} + r.top;
  int t = t0;
  for (; t + kLanes <= std::min(end, whole); t += kLanes) {
    vf s = block_scores(r.q, j.k, b, kvh, t, j.D) * j.scale;
    if (r.allowed)
      for (int e = 0; e < kLanes; ++e)
        if (!r.allowed[t + e]) s[e] = kHidden;
    store(r.scores + t, s);
    top = s > top ? s : top;
  }
  for (int e = 0; e < kLanes; ++e) r.top = std::max(r.top, top[e]);
  for (; t < end; ++t) {
    r.scores[t] = r.allowed && !r.allowed[t] ? kHidden : dot(r.q, j.k.at(b, kvh, t), j.D) * j.scale;
    r.top = std::max(r.top, r.scores[t]);
  }
}

// Probabilities in place (a hidden key's 0) and their total (key t in lane t % kLanes, summed at the end).
void probabilities(Query& r) {
  vf lanes = vf{};
  int t = 0;
  for (; t + kLanes <= r.limit; t += kLanes) {
    vf s = load(r.scores + t);
    vf e = vexp(s - r.top);
    e = s == kHidden ? vf{} : e;
    store(r.scores + t, e);
    lanes += e;
  }
  r.total = lane_total(lanes);
  for (; t < r.limit; ++t) {
    r.scores[t] = r.scores[t] == kHidden ? 0.0f : sexp(r.scores[t] - r.top);
    r.total += r.scores[t];
  }
}

// sums += p[t] v[t] for the visible keys in [t0, t1) (t0 even), in registers: C vectors a key (D =
// C * kLanes), even and odd positions in two sets of accumulators where registers allow, so two chains of
// multiply-adds run.
template <int C>
inline void add_key(vf* acc, const float* v, float p) {
  vf pv = vf{} + p;
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) acc[c] = multiply_add(pv, load(v + c * kLanes), acc[c]);
}

template <int C>
void tile_values(const Job& j, Query& r, int b, int kvh, int t0, int t1) {
  int end = std::min(t1, r.limit);
  if (t0 >= end) return;
  constexpr bool kTwo = 2 * C <= 8;  // two sets fit the registers (AVX-512 at D = 64); else one chain
  vf even[C], odd[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) even[c] = load(r.sums + c * kLanes), odd[c] = load(r.sums + (C + c) * kLanes);
  const float* p = r.scores;
  int t = t0;
  for (; t + 2 <= end; t += 2) {
    if (!r.allowed || r.allowed[t]) add_key<C>(even, j.v.at(b, kvh, t), p[t]);
    if (!r.allowed || r.allowed[t + 1]) add_key<C>(kTwo ? odd : even, j.v.at(b, kvh, t + 1), p[t + 1]);
  }
  if (t < end && (!r.allowed || r.allowed[t])) add_key<C>(even, j.v.at(b, kvh, t), p[t]);
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) store(r.sums + c * kLanes, even[c]), store(r.sums + (C + c) * kLanes, odd[c]);
}

// Any head size: the same sums, a key at a time, through memory.
void tile_values_any(const Job& j, Query& r, int b, int kvh, int t0, int t1) {
  for (int t = t0; t < std::min(t1, r.limit); ++t)
    if (!r.allowed || r.allowed[t]) add_scaled(r.sums + (t % 2) * j.D, j.v.at(b, kvh, t), r.scores[t], j.D);
}

void values(const Job& j, Query* rows, int count, int b, int kvh, int limit) {
  int C = j.D % kLanes == 0 ? j.D / kLanes : 0;
  for (int t0 = 0; t0 < limit; t0 += kTile)
    for (int n = 0; n < count; ++n) {
      if (rows[n].top == kHidden) continue;
      if (C == 4) tile_values<4>(j, rows[n], b, kvh, t0, t0 + kTile);
      else if (C == 2) tile_values<2>(j, rows[n], b, kvh, t0, t0 + kTile);
      else if (C == 8) tile_values<8>(j, rows[n], b, kvh, t0, t0 + kTile);
      else tile_values_any(j, rows[n], b, kvh, t0, t0 + kTile);
    }
}

// Query rows [first, first + count) of key head kvh's group (its heads' rows, head-major): softmax(scale q
// K^T) V, each row over the keys it may see, ascending. The rows share each tile of keys and values
// while it sits in L1 (reading the cache once for them all), but every row's sums are its own.
void group(const Job& j, int b, int kvh, int first, int count, std::vector<float>& scratch) {
  int G = j.Hq / j.Hkv;
  scratch.resize((size_t)count * (j.S + 2 * j.D));
  std::vector<Query> rows(count);
  int limit = 0;
  for (int n = 0; n < count; ++n) {
    int h = kvh * G + (first + n) / j.L, i = (first + n) % j.L;
    Query& r = rows[n];
    r.q = j.q.at(b, h, i);
    r.allowed = j.mask.data ? j.mask.at(b, h, i) : nullptr;
    r.limit = j.causal ? j.S - j.L + i + 1 : j.S;  // the cache ends with these L rows
    r.out = j.out + (((size_t)b * j.L + i) * j.Hq + h) * j.D;
    r.scores = scratch.data() + (size_t)n * (j.S + 2 * j.D);
    r.sums = r.scores + j.S;
    std::fill(r.sums, r.sums + 2 * j.D, 0.0f);
    limit = std::max(limit, r.limit);
  }
  for (int t0 = 0; t0 < limit; t0 += kTile)
    for (Query& r : rows) tile_scores(j, r, b, kvh, t0, t0 + kTile);
  for (Query& r : rows)
    if (r.top != kHidden) probabilities(r);
  values(j, rows.data(), count, b, kvh, limit);
  for (Query& r : rows) {
    if (r.top == kHidden) {  // nothing visible: zeros
      std::fill(r.out, r.out + j.D, 0.0f);
      continue;
    }
    float inverse = 1.0f / r.total;
    for (int d = 0; d < j.D; ++d) r.out[d] = (r.sums[d] + r.sums[j.D + d]) * inverse;
  }
}

}  // namespace

// Units of work: each key head's group of query rows, split in parts where there are fewer groups
// than twice the cores (each part reads the group's keys once, so fewer parts read less).
void run(const Job& j) {
  int groups = j.B * j.Hkv, rows = (j.Hq / j.Hkv) * j.L;
  Workers& pool = Workers::get();
  bool alone = pool.count() <= 1 || (size_t)groups * rows * j.S * j.D < (1u << 15);
  int parts = alone ? 1 : std::min(rows, (2 * pool.count() + groups - 1) / groups);
  int per_part = (rows + parts - 1) / parts;
  auto unit = [&](int u) {
    thread_local std::vector<float> scratch;  // each thread's, kept between calls
    int g = u / parts, first = u % parts * per_part;
    if (first < rows) group(j, g / j.Hkv, g % j.Hkv, first, std::min(per_part, rows - first), scratch);
  };
  if (!alone) return pool.run(groups * parts, unit);
  for (int u = 0; u < groups * parts; ++u) unit(u);
}

}  // namespace metrale
