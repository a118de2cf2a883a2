// SPDX-License-Identifier: Apache-2.0
// Streaming ops — RoPE, axial RoPE and SwiGLU, forward and backward — on
// tensors far larger than the caches. Their figure is bandwidth: bytes read
// plus bytes written per call (tables included), against the copy
// bandwidth of the roofline probe.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace tandem::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

/// Buffers of one streaming call: a source, an optional second source, the
/// output and optional cos/sin tables.
struct StreamFixture {
  std::vector<float> src, src2, dst, cos, sin;
};

using StreamCall = std::function<void(const Backend&, StreamFixture&)>;

void add_stream(const std::string& op, const BackendUnderTest& bu, const std::string& shape,
                const std::vector<std::string>& tags, double bytes,
                std::map<std::string, double> params,
                const std::function<std::unique_ptr<StreamFixture>()>& make,
                const StreamCall& call) {
  Spec s;
  s.op = op;
  s.backend = bu.name;
  s.shape = shape;
  s.threads = bu.threads;
  s.name = op + "/" + bu.name + "/" + shape;
  s.tags = tags;
  s.params = std::move(params);
  s.params["bytes"] = bytes;
  const std::string key = s.name;
  const int threads = bu.threads;
  auto be = std::make_shared<Backend>(bu.make());
  add(s, [be, key, bytes, threads, make, call](benchmark::State& st) {
    StreamFixture* fx = nullptr;
    try {
      fx = &cached_fixture<StreamFixture>(key, make);
      call(*be, *fx);  // warm-up
    } catch (const std::exception& e) {
      st.SkipWithError(e.what());
      return;
    }
    const auto loop_start = std::chrono::steady_clock::now();
    for (auto _ : st) {
      call(*be, *fx);
      benchmark::ClobberMemory();
    }
    set_byte_counters(st, bytes, threads, seconds_since(loop_start));
  });
}

// ---- RoPE ----------------------------------------------------------------------------

/// What a RoPE benchmark varies beyond the shape: the layout, position ids
/// (a table row per token, spread over a longer cache) and q and k in one
/// call (k with k_heads heads).
struct RopeVariant {
  RopeLayout layout = RopeLayout::bshd;
  bool position_ids = false;
  std::int64_t k_heads = 0;
};

/// Buffers of a RoPE call: x (or q) in src, k in src2, outputs in dst (q's, then k's).
void add_rope(const BackendUnderTest& bu, std::int64_t batch, std::int64_t S, std::int64_t H,
              std::int64_t D, const std::vector<std::string>& tags, RopeVariant v = {}) {
  RopeQkParams qk;
  RopeParams& p = qk.q;
  p.batch = batch;
  p.seq = S;
  p.width = H * D;
  p.head_dim = D;
  p.layout = v.layout;
  p.style = RopeStyle::neox;
  p.table_rows = v.position_ids ? 4 * S : S;
  p.rows = v.position_ids ? TableRows::position_ids : TableRows::position;
  qk.k_width = std::max<std::int64_t>(v.k_heads, 1) * D;
  const RopeQkPlan both = RopeQkPlan::make(qk);
  const RopePlan& plan = both.q;
  const std::int64_t k_size = v.k_heads > 0 ? both.k.out_size() : 0;
  const double x_bytes = 4.0 * static_cast<double>(plan.out_size() + k_size);
  const double table_bytes = 2.0 * 4.0 * static_cast<double>(plan.R * plan.T) +
                             (v.position_ids ? 8.0 * static_cast<double>(batch * S) : 0.0);
  std::string shape = join_tag({{"B", batch}, {"S", S}, {"H", H}, {"D", D}});
  if (v.k_heads > 0) shape += "_Hkv" + std::to_string(v.k_heads);
  if (v.layout != RopeLayout::bshd) shape += std::string("_") + to_string(v.layout);
  if (v.position_ids) shape += "_ids";
  std::map<std::string, double> params{{"B", double(batch)},
                                       {"S", double(S)},
                                       {"H", double(H)},
                                       {"D", double(D)},
                                       {"x_MiB", x_bytes / kMiB}};
  auto positions = std::make_shared<std::vector<std::int64_t>>();
  if (v.position_ids) {  // every sequence at its own offset into the cache
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t s = 0; s < S; ++s) positions->push_back((b * 977 + s) % plan.R);
    }
  }
  auto make = [plan, k_size] {
    auto f = std::make_unique<StreamFixture>();
    f->src = random_buffer(static_cast<std::size_t>(plan.out_size()), 21);
    f->src2 = random_buffer(static_cast<std::size_t>(k_size), 22);
    f->dst = zero_buffer(static_cast<std::size_t>(plan.out_size() + k_size));
    f->cos.resize(static_cast<std::size_t>(plan.R * plan.T));
    f->sin.resize(f->cos.size());
    for (std::int64_t r = 0; r < plan.R; ++r) {
      for (std::int64_t i = 0; i < plan.T; ++i) {
        const double inv =
            std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(plan.D));
        const double a = static_cast<double>(r) * inv;
        f->cos[static_cast<std::size_t>(r * plan.T + i)] = static_cast<float>(std::cos(a));
        f->sin[static_cast<std::size_t>(r * plan.T + i)] = static_cast<float>(std::sin(a));
      }
    }
    return f;
  };
  const auto tables = [positions](const StreamFixture& f) {
    return RopeTables<float>{f.cos, f.sin, Indices(std::span<const std::int64_t>(*positions))};
  };
  for (const bool backward : {false, true}) {
    const std::string op =
        std::string(backward ? "rope_backward" : "rope_forward") + (v.k_heads > 0 ? "_qk" : "");
    if (!op_selected(op)) continue;
    if (v.k_heads > 0) {
      const auto& entry = backward ? &Backend::rope_backward_qk : &Backend::rope_forward_qk;
      add_stream(op, bu, shape, tags, 2 * x_bytes + table_bytes, params, make,
                 [both, entry, tables](const Backend& be, StreamFixture& f) {
                   const std::span<float> out(f.dst);
                   (be.*entry)(both, f.src, f.src2, tables(f), out.first(both.q.out_size()),
                               out.subspan(both.q.out_size()));
                 });
    } else {
      const auto& entry = backward ? &Backend::rope_backward : &Backend::rope_forward;
      add_stream(op, bu, shape, tags, 2 * x_bytes + table_bytes, params, make,
                 [plan, entry, tables](const Backend& be, StreamFixture& f) {
                   (be.*entry)(plan, f.src, tables(f), f.dst);
                 });
    }
  }
}

// ---- axial RoPE ------------------------------------------------------------------------

void add_axial(const BackendUnderTest& bu, std::int64_t batch, std::int64_t side, std::int64_t W,
               std::int64_t heads, const std::vector<std::string>& tags) {
  AxialRopeParams p;
  p.batch = batch;
  p.seq = side * side;
  p.width = W;
  p.num_heads = heads;
  p.end_x = p.end_y = side;
  const AxialRopePlan plan = AxialRopePlan::make(p);
  const double x_bytes = 4.0 * static_cast<double>(plan.out_size());
  const std::string shape =
      join_tag({{"B", batch}, {"X", side}, {"Y", side}, {"W", W}, {"H", heads}});
  std::map<std::string, double> params{{"B", double(batch)},
                                       {"S", double(side * side)},
                                       {"W", double(W)},
                                       {"H", double(heads)},
                                       {"x_MiB", x_bytes / kMiB}};
  auto make = [plan] {
    auto f = std::make_unique<StreamFixture>();
    f->src = random_buffer(static_cast<std::size_t>(plan.out_size()), 31);
    f->dst = zero_buffer(static_cast<std::size_t>(plan.out_size()));
    return f;
  };
  if (op_selected("axial_rope_forward")) {
    add_stream(
        "axial_rope_forward", bu, shape, tags, 2 * x_bytes, params, make,
        [plan](const Backend& be, StreamFixture& f) { be.axial_rope_forward(plan, f.src, f.dst); });
  }
  if (op_selected("axial_rope_backward")) {
    add_stream("axial_rope_backward", bu, shape, tags, 2 * x_bytes, params, make,
               [plan](const Backend& be, StreamFixture& f) {
                 be.axial_rope_backward(plan, f.src, f.dst);
               });
  }
}

// ---- SwiGLU --------------------------------------------------------------------------------

void add_swiglu(const BackendUnderTest& bu, std::int64_t rows, std::int64_t n,
                const std::vector<std::string>& tags) {
  const SwigluPlan plan = SwigluPlan::make({rows, n, true});
  const double x_bytes = 4.0 * static_cast<double>(plan.in_size());
  const double y_bytes = 4.0 * static_cast<double>(plan.out_size());
  const std::string shape = join_tag({{"rows", rows}, {"n", n}});
  std::map<std::string, double> params{
      {"rows", double(rows)}, {"n", double(n)}, {"x_MiB", x_bytes / kMiB}};
  if (op_selected("swiglu_forward")) {
    auto make = [plan] {
      auto f = std::make_unique<StreamFixture>();
      f->src = random_buffer(static_cast<std::size_t>(plan.in_size()), 41, -4.f, 4.f);
      f->dst = zero_buffer(static_cast<std::size_t>(plan.out_size()));
      return f;
    };
    add_stream(
        "swiglu_forward", bu, shape, tags, x_bytes + y_bytes, params, make,
        [plan](const Backend& be, StreamFixture& f) { be.swiglu_forward(plan, f.src, f.dst); });
  }
  if (op_selected("swiglu_backward")) {
    auto make = [plan] {
      auto f = std::make_unique<StreamFixture>();
      f->src = random_buffer(static_cast<std::size_t>(plan.in_size()), 41, -4.f, 4.f);
      f->src2 = random_buffer(static_cast<std::size_t>(plan.out_size()), 42);
      f->dst = zero_buffer(static_cast<std::size_t>(plan.in_size()));
      return f;
    };
    add_stream("swiglu_backward", bu, shape, tags, 2 * x_bytes + y_bytes, params, make,
               [plan](const Backend& be, StreamFixture& f) {
                 be.swiglu_backward(plan, f.src, f.src2, f.dst);
               });
  }
}

}  // namespace

void register_streaming() {
  const Config& c = config();
  const bool quick = c.preset == Preset::quick;
  // Main sizes: x is 128 MiB (64 MiB in the quick preset), far beyond any cache.
  const std::int64_t big = quick ? 1 : 2;
  for (const auto& bu : backends_at(c.threads, false)) {
    add_rope(bu, big, 4096, 32, 128, {"main", "peer"});
    // [B, H, S, D] with position ids; q (32 heads) and k (8) in one call.
    add_rope(bu, big, 4096, 32, 128, {"main"}, {RopeLayout::bhsd, true, 0});
    add_rope(bu, big, 4096, 32, 128, {"main"}, {RopeLayout::bshd, true, 8});
    add_axial(bu, 16 * big, 64, 256, 1, {"main", "peer"});
    add_swiglu(bu, 2048 * big, 4096, {"main", "peer"});
  }
  // Small sizes (4 MiB), where the reference is measured beside the optimized backend.
  for (const auto& bu : backends_at(c.threads, true)) {
    add_rope(bu, 1, 256, 32, 128, {"small"});
    add_axial(bu, 1, 64, 256, 1, {"small"});
    add_swiglu(bu, 128, 4096, {"small"});
  }
}

}  // namespace tandem::bench
