// SPDX-License-Identifier: Apache-2.0
// `tandem tune`: searches the bit-neutral geometry fields (tuning.hpp, SPEC
// §11) of the optimized attention on this CPU for each shape class, times
// every candidate against the default geometry in alternating pairs, checks
// that the winner's outputs have the default's bits, and writes the tuning.
#include "tune.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tandem/optimized/backend.hpp"
#include "tandem/optimized/tuning.hpp"

namespace tandem::tool {
namespace {

using optimized::ShapeKind;
using Clock = std::chrono::steady_clock;

/// One shape a class is timed at (bshd, no mask: the calls rows_per_tile
/// reaches; decode and backward have no bit-neutral field, see tuning.hpp).
struct TuneShape {
  ShapeKind kind;
  std::int64_t B, Sq, Sk, H, Hkv, D;
};

/// The report's classes: prefill, decode and backward at D = 64 and 128;
/// `tiny`: the same kinds at D = 16 and a few hundred keys (tests).
std::vector<TuneShape> shapes(bool tiny) {
  if (tiny) {
    return {{ShapeKind::prefill, 1, 192, 192, 2, 2, 16},
            {ShapeKind::decode, 1, 1, 256, 4, 2, 16},
            {ShapeKind::backward, 1, 64, 64, 2, 2, 16}};
  }
  std::vector<TuneShape> out;
  for (std::int64_t D : {64, 128}) {
    out.push_back({ShapeKind::prefill, 1, 1024, 1024, 8, 8, D});
    out.push_back({ShapeKind::decode, 4, 1, 4096, 32, 8, D});
    out.push_back({ShapeKind::backward, 1, 1024, 1024, 16, 16, D});
  }
  return out;
}

/// The buffers of one call of `s` (random inputs, fixed seed).
struct Buffers {
  AttentionPlan plan;
  std::vector<float> q, k, v, out;
  explicit Buffers(const TuneShape& s) {
    AttentionParams p;
    p.B = s.B;
    p.Sq = s.Sq;
    p.Sk = s.Sk;
    p.H = s.H;
    p.Hkv = s.Hkv;
    p.D = s.D;
    p.Dv = s.D;
    plan = AttentionPlan::make(p);
    std::mt19937 g(1234);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const auto fill = [&](std::vector<float>& x, std::int64_t n) {
      x.resize(static_cast<std::size_t>(n));
      for (float& e : x) e = u(g);
    };
    fill(q, plan.q.extent);
    fill(k, plan.k.extent);
    fill(v, plan.v.extent);
    out.assign(static_cast<std::size_t>(plan.o.extent), 0.0f);
  }
};

/// The optimized backend at `geo`, ignoring TANDEM_TUNING.
Backend backend_at(const optimized::Geometry& geo, int threads) {
  optimized::Options o(threads, geo);
  o.tuning_from_environment = false;
  return optimized::backend(o);
}

/// Seconds of one forward call.
double time_call(const Backend& be, Buffers& b) {
  const auto t0 = Clock::now();
  be.attention_forward(b.plan, {b.q, b.k, b.v, {}}, b.out);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x[x.size() / 2];
}

/// Paired timings of the default and a candidate: per pair t_default /
/// t_candidate, and each side's times.
struct Paired {
  std::vector<double> ratios, t_default, t_candidate;
  double median_ratio() const { return median(ratios); }
  /// The p-quantile of the ratios (p in [0, 1]).
  double ratio_at(double p) const {
    std::vector<double> r = ratios;
    std::sort(r.begin(), r.end());
    return r.empty() ? 0.0 : r[static_cast<std::size_t>(p * static_cast<double>(r.size() - 1))];
  }
};

/// Pairs of calls at the default and at the candidate, alternating which
/// runs first, for about `budget` seconds: at least 3 pairs unless
/// `deadline` (the whole search's end) passes first, and at least one.
Paired paired_times(const Backend& def, const Backend& cand, Buffers& b, double budget,
                    Clock::time_point deadline) {
  Paired out;
  const auto start = Clock::now();
  for (int i = 0;; ++i) {
    double td = 0, tc = 0;
    if (i % 2 == 0) {
      td = time_call(def, b);
      tc = time_call(cand, b);
    } else {
      tc = time_call(cand, b);
      td = time_call(def, b);
    }
    if (tc > 0) out.ratios.push_back(td / tc);
    out.t_default.push_back(td);
    out.t_candidate.push_back(tc);
    const auto now = Clock::now();
    const double spent = std::chrono::duration<double>(now - start).count();
    if ((i >= 2 && spent >= budget) || now >= deadline) break;
  }
  return out;
}

/// Whether the forward at `a` and at `b` writes the same bits.
bool same_bits(const Backend& a, const Backend& b, Buffers& buf) {
  a.attention_forward(buf.plan, {buf.q, buf.k, buf.v, {}}, buf.out);
  const std::vector<float> first = buf.out;
  std::fill(buf.out.begin(), buf.out.end(), -1.0f);
  b.attention_forward(buf.plan, {buf.q, buf.k, buf.v, {}}, buf.out);
  return std::equal(first.begin(), first.end(), buf.out.begin(), [](float x, float y) {
    return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
  });
}

/// The median paired speedup a winner needs, in its search and again in a
/// fresh run, to replace the default.
constexpr double kMinSpeedup = 1.02;

/// Tunes one class within `budget` seconds: the best rows_per_tile by paired
/// speedup over the default, kept only when it is faster (median ratio >
/// kMinSpeedup in the search and when timed again) and its bits are the
/// default's. Returns the fields (none: default).
optimized::TunedFields tune_class(const TuneShape& s, int threads, double budget,
                                  Clock::time_point deadline) {
  const optimized::TuningSpace space = optimized::tuning_space(s.kind);
  const std::string name = fmt::format("{} D={}", optimized::to_string(s.kind), s.D);
  if (space.empty()) {
    fmt::print("{}: no bit-neutral field reaches these calls; default kept\n", name);
    return {};
  }
  Buffers buf(s);
  const optimized::Geometry def_geo;
  const Backend def = backend_at(def_geo, threads);
  // one share per candidate, one more to time the winner again
  const double per = budget / static_cast<double>(space.rows_per_tile.size() + 1);
  std::int64_t best = def_geo.rows_per_tile;
  double best_ratio = 1.0;
  for (std::int64_t rows : space.rows_per_tile) {
    if (Clock::now() >= deadline) {
      fmt::print("{}: time is up; rows_per_tile from {} not tried\n", name, rows);
      break;
    }
    optimized::Geometry g = def_geo;
    g.rows_per_tile = rows;
    const double r = paired_times(def, backend_at(g, threads), buf, per, deadline).median_ratio();
    fmt::print("{}: rows_per_tile {:5} median speedup over default {:.3f}\n", name, rows, r);
    std::fflush(stdout);
    if (r > best_ratio) {
      best_ratio = r;
      best = rows;
    }
  }
  optimized::Geometry g = def_geo;
  g.rows_per_tile = best;
  if (best != def_geo.rows_per_tile && best_ratio > kMinSpeedup) {
    // the best of many noisy scores is biased upwards: a fresh run decides
    best_ratio = paired_times(def, backend_at(g, threads), buf, per, deadline).median_ratio();
    fmt::print("{}: rows_per_tile {} timed again: median speedup {:.3f}\n", name, best, best_ratio);
  }
  if (best == def_geo.rows_per_tile || best_ratio <= kMinSpeedup) {
    fmt::print("{}: default rows_per_tile {} kept\n", name, def_geo.rows_per_tile);
    return {};
  }
  if (!same_bits(def, backend_at(g, threads), buf)) {
    throw Error("tune", name + ": rows_per_tile " + std::to_string(best) +
                            " changed the output's bits; nothing written");
  }
  fmt::print("{}: rows_per_tile {} (median speedup {:.3f}, bits unchanged)\n", name, best,
             best_ratio);
  optimized::TunedFields f;
  f.rows_per_tile = best;
  return f;
}

/// The tuning of `path` for the comparison: loaded as a call would load it
/// (another CPU's: an Error, there is nothing to compare).
optimized::Tuning tuning_to_compare(const std::string& path) {
  std::optional<optimized::Tuning> t = optimized::load_tuning(path);
  if (!t) throw Error("tune", "tuning file " + path + " is for another CPU: nothing to compare");
  return *t;
}

}  // namespace

int compare(const TuneArgs& args) {
  const auto tuning = std::make_shared<const optimized::Tuning>(tuning_to_compare(args.compare));
  fmt::print("default and tuned ({}) on {}, {} thread(s), paired calls\n\n", args.compare,
             optimized::to_string(optimized::current_cpu()),
             args.threads == 0 ? std::string("all") : std::to_string(args.threads));
  fmt::print(
      "| class | rows_per_tile default / tuned | default ms | tuned ms | speedup median "
      "[p25, p75] | bits |\n|---|---|---|---|---|---|\n");
  const std::vector<TuneShape> todo = shapes(args.tiny);
  const auto tuned_classes = std::count_if(todo.begin(), todo.end(), [&](const TuneShape& s) {
    return tuning->find({s.kind, s.D}) != nullptr;
  });
  const double share =
      args.seconds / static_cast<double>(std::max<std::ptrdiff_t>(1, tuned_classes));
  const auto deadline = Clock::now() + std::chrono::hours(1);
  for (const TuneShape& s : todo) {
    Buffers buf(s);
    const optimized::ShapeClass cls{s.kind, s.D};
    const optimized::Geometry def_geo, tuned_geo = tuning->geometry(cls, def_geo);
    optimized::Options o(args.threads);
    o.tuning = tuning;
    o.tuning_from_environment = false;
    if (tuning->find(cls) == nullptr) {
      fmt::print("| {} D={} | {} (not tuned) | | | | |\n", optimized::to_string(s.kind), s.D,
                 def_geo.rows_per_tile);
      continue;
    }
    const Backend def = backend_at(def_geo, args.threads), tuned = optimized::backend(o);
    const Paired p = paired_times(def, tuned, buf, share, deadline);
    fmt::print("| {} D={} | {} / {} | {:.3f} | {:.3f} | {:.3f} [{:.3f}, {:.3f}] | {} |\n",
               optimized::to_string(s.kind), s.D, def_geo.rows_per_tile, tuned_geo.rows_per_tile,
               1e3 * median(p.t_default), 1e3 * median(p.t_candidate), p.median_ratio(),
               p.ratio_at(0.25), p.ratio_at(0.75), same_bits(def, tuned, buf) ? "same" : "DIFFER");
    std::fflush(stdout);
  }
  return 0;
}

int tune(const TuneArgs& args) {
  const std::vector<TuneShape> todo = shapes(args.tiny);
  optimized::Tuning t;
  t.cpu = optimized::current_cpu();
  fmt::print("tuning on {} for {:.0f} s, {} thread(s)\n", optimized::to_string(t.cpu), args.seconds,
             args.threads == 0 ? std::string("all") : std::to_string(args.threads));
  // Classes without a field to tune take no time: the budget is the others'.
  const auto tunable = std::count_if(todo.begin(), todo.end(), [](const TuneShape& s) {
    return !optimized::tuning_space(s.kind).empty();
  });
  const double per_class = args.seconds / static_cast<double>(std::max<std::ptrdiff_t>(1, tunable));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(args.seconds));
  for (const TuneShape& s : todo) {
    const optimized::TunedFields f = tune_class(s, args.threads, per_class, deadline);
    if (f.rows_per_tile) t.classes.push_back({{s.kind, s.D}, f});
  }
  optimized::save_tuning(t, args.out);
  fmt::print("wrote {} ({} tuned class(es))\n", args.out, t.classes.size());
  return 0;
}

}  // namespace tandem::tool
