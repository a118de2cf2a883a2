// SPDX-License-Identifier: Apache-2.0
// The optimized attention at small geometries (tandem::optimized::Geometry):
// key blocks of 1 to 8 keys, tiles of a few query rows, split-key decode
// from 2 chunks on a 12-key cache, forced backward query parts, the wide
// tile forced on decode steps and the decode tile forced on wide ones, so
// that cases of a dozen keys cross every block, tile, chunk and part
// boundary. Each call agrees with the reference backend to float rounding
// and is bitwise the same at 1, 2 and 3 threads, on every Highway target;
// every geometry changes some result bits against the default one (the
// setting reaches the kernels). Bad geometries are errors naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
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
};

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
  return c;
}

/// Inputs of a case: values in [-2, 2], NaN in the gaps between strided
/// rows; key_padding keeps ~70% of the keys, bias is ~20% −inf.
struct Data {
  AttentionPlan plan;
  Vec q, k, v, mask, dout;
  explicit Data(const AttentionParams& params)
      : plan(AttentionPlan::make(params)),
        q(test::random_values<float>(static_cast<std::size_t>(plan.q.extent), 1, -2, 2)),
        k(test::random_values<float>(static_cast<std::size_t>(plan.k.extent), 2, -2, 2)),
        v(test::random_values<float>(static_cast<std::size_t>(plan.v.extent), 3, -2, 2)),
        dout(test::random_values<float>(static_cast<std::size_t>(plan.o.extent), 4, -2, 2)) {
    const Vec u = test::random_values<float>(static_cast<std::size_t>(plan.mask_size()), 5, 0, 1);
    mask.resize(u.size());
    for (std::size_t i = 0; i < u.size(); ++i) {
      if (plan.mask == MaskKind::key_padding) mask[i] = u[i] < 0.7f ? 1.0f : 0.0f;
      if (plan.mask == MaskKind::bias) {
        mask[i] = u[i] < 0.2f ? -std::numeric_limits<float>::infinity() : 4 * u[i] - 2;
      }
    }
  }
  [[nodiscard]] tandem::AttentionInputs<float> in() const { return {q, k, v, mask}; }
};

/// Every output of one backend on one case: out and lse, the one-call
/// gradients, those from the saved state, and each gradient alone.
struct Outputs {
  std::vector<Vec> all;
  static const std::vector<std::string>& names() {
    static const std::vector<std::string> n = {"out",      "lse",      "dq",       "dk",
                                               "dv",       "saved dq", "saved dk", "saved dv",
                                               "dq alone", "dk alone", "dv alone"};
    return n;
  }
};

Outputs run(const tandem::Backend& b, const Data& d) {
  const AttentionPlan& p = d.plan;
  Vec out(static_cast<std::size_t>(p.o.extent)), lse(static_cast<std::size_t>(p.lse_size()));
  b.attention_forward_lse(p, d.in(), out, lse);
  Vec dq(static_cast<std::size_t>(p.dq.extent)), dk(static_cast<std::size_t>(p.dk.extent)),
      dv(static_cast<std::size_t>(p.dv.extent));
  b.attention_backward(p, d.in(), d.dout, {dq, dk, dv});
  Vec sdq(dq.size()), sdk(dk.size()), sdv(dv.size());
  b.attention_backward_saved(p, d.in(), {out, lse}, d.dout, {sdq, sdk, sdv});
  Vec adq(dq.size()), adk(dk.size()), adv(dv.size());
  b.attention_backward_dq(p, d.in(), d.dout, adq);
  b.attention_backward_dk(p, d.in(), d.dout, adk);
  b.attention_backward_dv(p, d.in(), d.dout, adv);
  return {{out, lse, dq, dk, dv, sdq, sdk, sdv, adq, adk, adv}};
}

TEST(OptimizedGeometry, SmallGeometriesAgreeWithTheReferenceAndAcrossThreads) {
  const tandem::Backend ref = tandem::reference::backend();
  for (const NamedGeometry& ng : geometries()) {
    SCOPED_TRACE("geometry " + ng.name);
    bool differs_from_default = false;
    test::for_each_target([&] {
      for (const Case& c : cases()) {
        SCOPED_TRACE(c.name);
        const Data d(c.params);
        const Outputs want = run(ref, d);
        const Outputs one = run(opt::backend(opt::Options{1, ng.geometry}), d);
        const Outputs tuned = run(opt::backend(opt::Options{1}), d);
        for (std::size_t o = 0; o < want.all.size(); ++o) {
          const std::string& name = Outputs::names()[o];
          const bool is_out = o < 2;
          EXPECT_TRUE(
              test::close(one.all[o], want.all[o], is_out ? 5e-5 : 1e-4, is_out ? 1e-5 : 2e-5))
              << name;
          differs_from_default =
              differs_from_default || !test::bitwise_equal(one.all[o], tuned.all[o]);
        }
        for (const int threads : {2, 3}) {
          const Outputs many = run(opt::backend(opt::Options{threads, ng.geometry}), d);
          for (std::size_t o = 0; o < one.all.size(); ++o) {
            EXPECT_TRUE(test::bitwise(many.all[o], one.all[o]))
                << Outputs::names()[o] << ", " << threads << " threads against 1";
          }
        }
      }
    });
    EXPECT_TRUE(differs_from_default) << "no result bit moved: the geometry is not used";
  }
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
