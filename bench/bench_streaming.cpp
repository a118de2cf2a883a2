// SPDX-License-Identifier: Apache-2.0
// Streaming ops — RoPE, axial RoPE and SwiGLU, forward and backward — on
// tensors far larger than the caches. Their figure is bandwidth: bytes read
// plus bytes written per call (tables included), against the copy
// bandwidth of the roofline probe.
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
                std::function<std::unique_ptr<StreamFixture>()> make, StreamCall call) {
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

void add_rope(const BackendUnderTest& bu, std::int64_t batch, std::int64_t S, std::int64_t H,
              std::int64_t D, const std::vector<std::string>& tags) {
  RopeParams p;
  p.batch = batch;
  p.seq = S;
  p.width = H * D;
  p.head_dim = D;
  p.style = RopeStyle::neox;
  p.table_rows = S;
  p.rows = TableRows::position;
  const RopePlan plan = RopePlan::make(p);
  const double x_bytes = 4.0 * static_cast<double>(plan.out_size());
  const double table_bytes = 2.0 * 4.0 * static_cast<double>(plan.R * plan.T);
  const std::string shape = join_tag({{"B", batch}, {"S", S}, {"H", H}, {"D", D}});
  std::map<std::string, double> params{{"B", double(batch)},
                                       {"S", double(S)},
                                       {"H", double(H)},
                                       {"D", double(D)},
                                       {"x_MiB", x_bytes / kMiB}};
  auto make = [plan] {
    auto f = std::make_unique<StreamFixture>();
    f->src = random_buffer(static_cast<std::size_t>(plan.out_size()), 21);
    f->dst = zero_buffer(static_cast<std::size_t>(plan.out_size()));
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
  if (op_selected("rope_forward")) {
    add_stream("rope_forward", bu, shape, tags, 2 * x_bytes + table_bytes, params, make,
               [plan](const Backend& be, StreamFixture& f) {
                 be.rope_forward(plan, f.src, {f.cos, f.sin}, f.dst);
               });
  }
  if (op_selected("rope_backward")) {
    add_stream("rope_backward", bu, shape, tags, 2 * x_bytes + table_bytes, params, make,
               [plan](const Backend& be, StreamFixture& f) {
                 be.rope_backward(plan, f.src, {f.cos, f.sin}, f.dst);
               });
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
