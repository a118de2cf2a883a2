// SPDX-License-Identifier: Apache-2.0
// The optimized attention at small geometries (tandem::optimized::Geometry):
// key blocks of 1 to 8 keys, tiles of a few query rows, split-key decode
// from 2 chunks on a 12-key cache, forced backward query parts, the wide
// tile forced on decode steps and the decode tile forced on wide ones, so
// that cases of a dozen keys cross every block, tile, chunk and part
// boundary, the attention features among them (sinks, ALiBi, packed
// sequences with padding and empty sequences, paged caches of blocks of 2 to
// 4 keys, their unused slots NaN). Each call agrees with the reference
// backend to float rounding and is bitwise the same at 1, 2 and 3 threads,
// on every Highway target;
// every geometry changes some result bits against the default one (the
// setting reaches the kernels). Bad geometries are errors naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/tandem.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"

namespace {

namespace opt = tandem::optimized;
namespace test = tandem::test;
using tandem::AlibiKind;
using tandem::AttentionParams;
using tandem::AttentionPlan;
using tandem::Layout;
using tandem::MaskKind;
using Vec = std::vector<float>;
/// attention_params, under a short name for the case tables.
constexpr auto P = [](auto... args) { return test::attention_params(args...); };

struct NamedGeometry {
  std::string name;
  opt::Geometry geometry;
};

/// Small geometries, each crossing other boundaries on a dozen keys.
std::vector<NamedGeometry> geometries() {
  std::vector<NamedGeometry> all;
  {
    // one key per block, tiles of one query, split-key decode in 2 chunks
    // of 6 keys stepped 2 at a time, 2 backward parts
    opt::Geometry g;
    g.key_block = 1;
    g.edge_block = 1;
    g.rows_per_tile = 2;
    g.rows_per_tile_banded = 1;
    g.split_keys_chunk = 6;
    g.split_keys_step = 2;
    g.split_keys_contiguous_heads = 1000;
    g.backward_query_parts = 2;
    all.push_back({"keys1_rows2_split6", g});
  }
  {
    // blocks of 3 keys and 2 at an edge, the wide tile forced on decode
    // steps, 3 backward parts
    opt::Geometry g;
    g.key_block = 3;
    g.edge_block = 2;
    g.rows_per_tile = 5;
    g.rows_per_tile_banded = 3;
    g.decode_tiles = opt::DecodeTiles::never;
    g.backward_query_parts = 3;
    all.push_back({"keys3_edge2_wide_parts3", g});
  }
  {
    // the decode tile forced on every tile (several vectors of rows), and
    // split-key decode from 3 chunks of 4 keys stepped 3 at a time
    opt::Geometry g;
    g.key_block = 2;
    g.edge_block = 1;
    g.rows_per_tile = 7;
    g.rows_per_tile_banded = 4;
    g.decode_tiles = opt::DecodeTiles::always;
    g.split_keys_chunk = 4;
    g.split_keys_min_chunks = 3;
    g.split_keys_step = 3;
    g.split_keys_contiguous_heads = 1000;
    g.backward_min_tasks = 3;
    all.push_back({"keys2_decode_split4", g});
  }
  {
    // key blocks of one AVX2 vector, tall tiles, the decode tile forced
    // without any split
    opt::Geometry g;
    g.key_block = 8;
    g.edge_block = 3;
    g.rows_per_tile = 24;
    g.rows_per_tile_banded = 6;
    g.decode_tiles = opt::DecodeTiles::always;
    g.split_keys_min_chunks = 0;
    g.backward_min_tasks = 64;
    all.push_back({"keys8_decode_nosplit", g});
  }
  return all;
}

struct Case {
  std::string name;
  AttentionParams params;
  /// Packed sequences: cu_seqlens_q, cu_seqlens_k and seqused_k (or empty).
  std::vector<std::int64_t> cu_q = {}, cu_k = {}, used = {};
  /// A paged cache: block_table `[B, max_blocks]` (−1 past each length) and cache_seqlens `[B]`.
  std::vector<std::int32_t> table = {}, lens = {};
};

/// P(...) with sinks and ALiBi as asked.
AttentionParams with(AttentionParams p, bool sinks, AlibiKind alibi) {
  p.sinks = sinks;
  p.alibi = alibi;
  return p;
}

/// P(...) for n packed sequences of total_q queries and total_k keys.
AttentionParams packed(AttentionParams p, std::int64_t n) {
  p.num_seqs = n;
  return p;
}

/// P(B, Sq, 0, ...) over a paged cache of `blocks` blocks of `size` keys, `width` per table row.
AttentionParams paged(AttentionParams p, std::int64_t blocks, std::int64_t size,
                      std::int64_t width) {
  p.Sk = 0;
  p.num_blocks = blocks;
  p.block_size = size;
  p.max_blocks = width;
  return p;
}

/// Shapes of a dozen keys: decode steps, prefill, every mask kind, GQA and
/// MQA, both layouts, strided rows, Dv != D, softcap.
std::vector<Case> cases() {
  using enum MaskKind;
  std::vector<Case> c;
  c.push_back({"decode_gqa", P(1, 1, 12, 4, 2, 8)});
  c.push_back({"decode_causal_bhsd_dv", P(2, 2, 13, 6, 2, 5, 3, Layout::bhsd, causal)});
  c.push_back({"prefill_causal_gqa", P(1, 11, 12, 4, 2, 7, 0, Layout::bshd, causal)});
  c.push_back({"window_mqa_bhsd", P(2, 12, 12, 2, 1, 6, 0, Layout::bhsd, sliding_window, 3)});
  c.push_back({"key_padding_dv", P(2, 5, 12, 3, 3, 9, 4, Layout::bshd, key_padding)});
  {
    AttentionParams p = P(1, 6, 12, 2, 1, 8, 0, Layout::bshd, bias);
    p.bias_heads = 2;
    p.softcap = 2.0;
    c.push_back({"bias_softcap", p});
  }
  {
    AttentionParams p = P(1, 9, 12, 2, 2, 4, 0, Layout::bshd, causal);
    p.q_row_stride = p.k_row_stride = p.v_row_stride = 3 * 2 * 4 + 1;  // one fused row
    c.push_back({"fused_rows_causal", p});
  }
  // the features
  constexpr AlibiKind per_head = AlibiKind::per_head, per_batch_head = AlibiKind::per_batch_head;
  c.push_back({"sinks_gqa_causal",
               with(P(2, 5, 12, 4, 2, 8, 0, Layout::bshd, causal), true, AlibiKind::none)});
  c.push_back({"sinks_alibi_decode", with(P(2, 1, 13, 6, 2, 8), true, per_head)});
  {
    AttentionParams p = P(1, 7, 12, 4, 2, 6, 0, Layout::bhsd, sliding_window, 4);
    p.softcap = 3.0;
    c.push_back({"alibi_window_softcap_bhsd", with(p, false, per_batch_head)});
  }
  // sequences of 4, 0 and 6 queries over 5 (of 6), 3 and 4 (of 5) keys
  c.push_back(
      {"packed3_causal_padding",
       with(packed(P(1, 10, 14, 4, 2, 8, 0, Layout::bshd, causal), 3), true, per_batch_head),
       {0, 4, 4, 10},
       {0, 6, 9, 14},
       {5, 3, 4}});
  // decode steps of 3 sequences, one without keys
  c.push_back({"packed3_decode_window",
               with(packed(P(1, 3, 25, 4, 1, 8, 4, Layout::bshd, sliding_window, 5), 3), true,
                    AlibiKind::none),
               {0, 1, 2, 3},
               {0, 12, 12, 25}});
  c.push_back({"paged_decode_blocks3",
               with(paged(P(2, 1, 0, 4, 2, 8), 12, 3, 5), true, per_batch_head),
               {},
               {},
               {},
               {7, 2, 9, 0, 4, 3, 11, 5, -1, -1},
               {13, 7}});
  {
    // chunked prefill, one entry's cache shorter than the chunk; strided slots
    AttentionParams p = paged(P(2, 3, 0, 2, 1, 5, 7, Layout::bshd, causal), 9, 4, 4);
    p.k_row_stride = 8;
    p.v_row_stride = 9;
    c.push_back({"paged_prefill_blocks4",
                 with(p, false, per_head),
                 {},
                 {},
                 {},
                 {6, 1, 8, 3, 2, -1, -1, -1},
                 {11, 2}});
  }
  c.push_back({"paged_window_blocks2",
               with(paged(P(1, 4, 0, 4, 4, 16, 0, Layout::bshd, sliding_window, 3), 10, 2, 6), true,
                    AlibiKind::none),
               {},
               {},
               {},
               {9, 0, 8, 1, 7, 2},
               {12}});
  return c;
}

/// Inputs of a case: values in [-2, 2], NaN in the gaps between strided
/// rows, the padding keys of packed sequences and the slots of a paged
/// cache that no sequence reads; key_padding keeps ~70% of the keys, bias
/// is ~20% −inf; sinks in [-1, 3], ALiBi slopes in [0, 1/2].
struct Data {
  AttentionPlan plan;
  Vec q, k, v, mask, dout, sinks, slopes;
  Case c;
  explicit Data(const Case& case_)
      : plan(AttentionPlan::make(case_.params)),
        q(test::random_values<float>(static_cast<std::size_t>(plan.q.extent), 1, -2, 2)),
        k(test::random_values<float>(static_cast<std::size_t>(plan.k.extent), 2, -2, 2)),
        v(test::random_values<float>(static_cast<std::size_t>(plan.v.extent), 3, -2, 2)),
        dout(test::random_values<float>(static_cast<std::size_t>(plan.o.extent), 4, -2, 2)),
        sinks(test::random_values<float>(plan.sinks ? plan.H : 0, 6, -1, 3)),
        slopes(test::random_values<float>(plan.slopes_size(), 7, 0, 0.5f)),
        c(case_) {
    const Vec u = test::random_values<float>(static_cast<std::size_t>(plan.mask_size()), 5, 0, 1);
    mask.resize(u.size());
    for (std::size_t i = 0; i < u.size(); ++i) {
      if (plan.mask == MaskKind::key_padding) mask[i] = u[i] < 0.7f ? 1.0f : 0.0f;
      if (plan.mask == MaskKind::bias) {
        mask[i] = u[i] < 0.2f ? -std::numeric_limits<float>::infinity() : 4 * u[i] - 2;
      }
    }
    PoisonUnreadKeys();
  }
  [[nodiscard]] tandem::AttentionInputs<float> in() const {
    tandem::AttentionInputs<float> r{q, k, v, mask};
    r.sinks = sinks;
    r.alibi_slopes = slopes;
    r.cu_seqlens_q = c.cu_q;
    r.cu_seqlens_k = c.cu_k;
    r.seqused_k = c.used;
    r.block_table = c.table;
    r.cache_seqlens = c.lens;
    return r;
  }

 private:
  /// NaN in every K and V row no sequence reads (packed padding keys,
  /// unused slots of a paged cache).
  void PoisonUnreadKeys() {
    if (!plan.varlen() && !plan.paged()) return;
    std::vector<char> read(static_cast<std::size_t>(plan.kv_batch() * plan.kv_seq()), 0);
    for (std::int64_t n = 0; n < plan.sequences(); ++n) {
      const tandem::AttentionSeq s = plan.sequence(in(), n);
      for (std::int64_t j = 0; j < s.Sk; ++j) {
        const tandem::KeyRow r = s.key_row(j);
        read[static_cast<std::size_t>(r.batch * plan.kv_seq() + r.seq)] = 1;
      }
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t row = 0; row < read.size(); ++row) {
      if (read[row] != 0) continue;
      const auto b = static_cast<std::int64_t>(row) / plan.kv_seq();
      const auto j = static_cast<std::int64_t>(row) % plan.kv_seq();
      for (std::int64_t g = 0; g < plan.Hkv; ++g) {
        std::fill_n(k.begin() + plan.k.at(b, j, g), plan.D, nan);
        std::fill_n(v.begin() + plan.v.at(b, j, g), plan.Dv, nan);
      }
    }
  }
};

/// Every output of one backend on one case, by name: out and lse, then
/// (not for a paged cache) the one-call gradients, those from the saved
/// state and each gradient alone, dsinks among them with sinks.
using Outputs = std::vector<std::pair<std::string, Vec>>;

Outputs run(const tandem::Backend& b, const Data& d) {
  const AttentionPlan& p = d.plan;
  Vec out(static_cast<std::size_t>(p.o.extent)), lse(static_cast<std::size_t>(p.lse_size()));
  b.attention_forward_lse(p, d.in(), out, lse);
  Outputs all{{"out", out}, {"lse", lse}};
  if (p.paged()) return all;
  const auto sized = [](std::int64_t n) { return Vec(static_cast<std::size_t>(n)); };
  const std::int64_t n_sinks = p.sinks ? p.H : 0;
  Vec dq = sized(p.dq.extent), dk = sized(p.dk.extent), dv = sized(p.dv.extent);
  Vec ds = sized(n_sinks);
  b.attention_backward(p, d.in(), d.dout, {dq, dk, dv, ds});
  Vec sdq = sized(p.dq.extent), sdk = sized(p.dk.extent), sdv = sized(p.dv.extent);
  Vec sds = sized(n_sinks);
  b.attention_backward_saved(p, d.in(), {out, lse}, d.dout, {sdq, sdk, sdv, sds});
  Vec adq = sized(p.dq.extent), adk = sized(p.dk.extent), adv = sized(p.dv.extent);
  b.attention_backward_dq(p, d.in(), d.dout, adq);
  b.attention_backward_dk(p, d.in(), d.dout, adk);
  b.attention_backward_dv(p, d.in(), d.dout, adv);
  all.insert(all.end(), {{"dq", dq},
                         {"dk", dk},
                         {"dv", dv},
                         {"saved dq", sdq},
                         {"saved dk", sdk},
                         {"saved dv", sdv},
                         {"dq alone", adq},
                         {"dk alone", adk},
                         {"dv alone", adv}});
  if (p.sinks) {
    Vec ads = sized(n_sinks);
    b.attention_backward(p, d.in(), d.dout, {{}, {}, {}, ads});
    all.insert(all.end(), {{"dsinks", ds}, {"saved dsinks", sds}, {"dsinks alone", ads}});
  }
  return all;
}

/// The outputs of the optimized backend at geometry `geo` on one thread,
/// after checking them against the reference and against 2 and 3 threads
/// (bitwise).
Outputs check_case(const tandem::Backend& ref, const Data& d, const opt::Geometry& geo) {
  const Outputs want = run(ref, d);
  const Outputs one = run(opt::backend(opt::Options{1, geo}), d);
  for (std::size_t o = 0; o < want.size(); ++o) {
    const bool is_out = o < 2;
    EXPECT_TRUE(
        test::close(one[o].second, want[o].second, is_out ? 5e-5 : 1e-4, is_out ? 1e-5 : 2e-5))
        << want[o].first;
  }
  for (const int threads : {2, 3}) {
    const Outputs many = run(opt::backend(opt::Options{threads, geo}), d);
    for (std::size_t o = 0; o < one.size(); ++o) {
      EXPECT_TRUE(test::bitwise(many[o].second, one[o].second))
          << one[o].first << ", " << threads << " threads against 1";
    }
  }
  return one;
}

TEST(OptimizedGeometry, SmallGeometriesAgreeWithTheReferenceAndAcrossThreads) {
  const tandem::Backend ref = tandem::reference::backend();
  for (const NamedGeometry& ng : geometries()) {
    SCOPED_TRACE("geometry " + ng.name);
    bool differs_from_default = false;
    test::for_each_target([&] {
      for (const Case& c : cases()) {
        SCOPED_TRACE(c.name);
        const Data d(c);
        const Outputs one = check_case(ref, d, ng.geometry);
        const Outputs tuned = run(opt::backend(opt::Options{1}), d);
        for (std::size_t o = 0; o < one.size(); ++o) {
          differs_from_default =
              differs_from_default || !test::bitwise_equal(one[o].second, tuned[o].second);
        }
      }
    });
    EXPECT_TRUE(differs_from_default) << "no result bit moved: the geometry is not used";
  }
}

/// A block table `[B, max_blocks]` over `blocks` blocks for caches of
/// `lens` keys: each entry's used blocks drawn without repeats (seeded),
/// −1 past them.
std::vector<std::int32_t> block_table(const std::vector<std::int32_t>& lens, std::int64_t size,
                                      std::int64_t width, std::int64_t blocks) {
  std::vector<std::int32_t> order(static_cast<std::size_t>(blocks));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
  std::mt19937 gen(17);
  std::shuffle(order.begin(), order.end(), gen);
  std::vector<std::int32_t> table;
  std::size_t next = 0;
  for (const std::int32_t len : lens) {
    const std::int64_t used = (len + size - 1) / size;
    for (std::int64_t e = 0; e < width; ++e) table.push_back(e < used ? order[next++] : -1);
  }
  return table;
}

/// Feature cases large enough for the default geometry's blocks, tiles,
/// split-key chunks and backward parts: paged caches of 16-key blocks
/// (decode with split keys, chunked prefill whose key blocks span cache
/// blocks), packed sequences (prefill with padding, decode with split keys,
/// empty sequences).
std::vector<Case> default_geometry_cases() {
  using enum MaskKind;
  std::vector<Case> c;
  {
    // (chunks of 1024 keys: a sequence of 2500 splits into 3)
    const std::vector<std::int32_t> lens{2500, 0, 517};
    c.push_back({"paged_decode_split_blocks16",
                 with(paged(P(3, 1, 0, 8, 2, 64), 200, 16, 160), true, AlibiKind::per_batch_head),
                 {},
                 {},
                 {},
                 block_table(lens, 16, 160, 200),
                 lens});
  }
  {
    const std::vector<std::int32_t> lens{300, 40};
    c.push_back({"paged_prefill_causal_blocks16",
                 with(paged(P(2, 40, 0, 4, 4, 32, 0, Layout::bshd, causal), 24, 16, 20), false,
                      AlibiKind::per_head),
                 {},
                 {},
                 {},
                 block_table(lens, 16, 20, 24),
                 lens});
  }
  c.push_back({"packed_prefill_causal_parts",
               with(packed(P(1, 450, 480, 4, 1, 32, 0, Layout::bshd, causal), 3), true,
                    AlibiKind::per_batch_head),
               {0, 150, 150, 450},
               {0, 150, 160, 480},
               {150, 10, 300}});
  c.push_back({"packed_decode_split_window",
               with(packed(P(1, 4, 4400, 8, 2, 64, 0, Layout::bshd, sliding_window, 2100), 4), true,
                    AlibiKind::none),
               {0, 1, 2, 3, 4},
               {0, 2200, 2201, 2201, 4400}});
  return c;
}

TEST(OptimizedGeometry, FeaturesAgreeAtTheDefaultGeometry) {
  const tandem::Backend ref = tandem::reference::backend();
  test::for_each_target([&] {
    for (const Case& c : default_geometry_cases()) {
      SCOPED_TRACE(c.name);
      check_case(ref, Data(c), opt::Geometry{});
    }
  });
}

TEST(OptimizedGeometry, TheDefaultIsTheTunedGeometry) {
  const opt::Geometry g;
  EXPECT_EQ(g.key_block, 64);
  EXPECT_EQ(g.edge_block, 16);
  EXPECT_EQ(g.rows_per_tile, 384);
  EXPECT_EQ(g.rows_per_tile_banded, 192);
  EXPECT_EQ(g.decode_tiles, opt::DecodeTiles::one_vector);
  EXPECT_EQ(g.split_keys_chunk, 0);
  EXPECT_EQ(g.split_keys_min_chunks, 2);
  EXPECT_EQ(g.split_keys_step, 8);
  EXPECT_EQ(g.backward_min_tasks, 8);
  EXPECT_EQ(g.backward_query_parts, 0);
  EXPECT_NO_THROW(opt::backend(opt::Options{0, g}));
}

TEST(OptimizedGeometry, BadGeometriesAreErrorsNamingTheField) {
  const auto expect_bad = [](const std::string& field, auto&& change) {
    opt::Geometry g;
    change(g);
    test::expect_error(
        [&] {
          opt::backend(opt::Options{1, g});
        },
        "geometry." + field, {"must be in ["});
  };
  expect_bad("key_block", [](opt::Geometry& g) { g.key_block = 0; });
  expect_bad("key_block", [](opt::Geometry& g) { g.key_block = 4097; });
  expect_bad("edge_block", [](opt::Geometry& g) { g.edge_block = 0; });
  expect_bad("edge_block", [](opt::Geometry& g) {
    g.key_block = 4;
    g.edge_block = 5;
  });
  expect_bad("rows_per_tile", [](opt::Geometry& g) { g.rows_per_tile = 0; });
  expect_bad("rows_per_tile_banded", [](opt::Geometry& g) { g.rows_per_tile_banded = -3; });
  expect_bad("split_keys_chunk", [](opt::Geometry& g) { g.split_keys_chunk = -1; });
  expect_bad("split_keys_min_chunks", [](opt::Geometry& g) { g.split_keys_min_chunks = -1; });
  expect_bad("split_keys_contiguous_heads",
             [](opt::Geometry& g) { g.split_keys_contiguous_heads = -1; });
  expect_bad("split_keys_step", [](opt::Geometry& g) { g.split_keys_step = 0; });
  expect_bad("backward_min_tasks", [](opt::Geometry& g) { g.backward_min_tasks = 0; });
  expect_bad("backward_query_parts", [](opt::Geometry& g) { g.backward_query_parts = -2; });
  opt::Geometry g;
  g.decode_tiles = static_cast<opt::DecodeTiles>(7);
  test::expect_error(
      [&] {
        opt::backend(opt::Options{1, g});
      },
      "geometry.decode_tiles", {"one_vector"});
}

}  // namespace

#else
TEST(OptimizedGeometry, NotBuilt) {
  GTEST_SKIP() << "built without the optimized backend";
}
#endif
