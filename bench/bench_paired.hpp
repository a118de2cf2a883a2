// SPDX-License-Identifier: Apache-2.0
/// @file bench_paired.hpp
/// @brief Paired measurements: several kinds of one call (f32, bf16, ...)
///        timed in turn inside every iteration of one benchmark, so that
///        their ratios come from the same moments of the same run, and the
///        counters that summarise them.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.hpp"

namespace tandem::bench {

/// The wall times of every kind in every iteration. Kind 0 is the baseline
/// (f32) the speedups divide by.
class PairedTimes {
 public:
  explicit PairedTimes(std::vector<std::string> kinds)
      : kinds_(std::move(kinds)), seconds_(kinds_.size()) {}

  /// Records one call of `kind` that took `seconds`.
  void add(std::size_t kind, double seconds) { seconds_[kind].push_back(seconds); }

  /// Rounds a reported benchmark has at least (after its loop, if need be),
  /// so that a shape of seconds a call still has a spread.
  static constexpr std::size_t kMinRounds = 7;

  /// Times `run(k)` for every kind k in every iteration of `st`, iteration i
  /// starting from kind i mod n, so that no kind always runs first (or right
  /// after the same neighbour); when the loop lasted `min_time` seconds (the
  /// run Google Benchmark reports, not one of its trial runs), more rounds
  /// after it until there are kMinRounds (never, by default).
  template <class Run>
  void time_iterations(benchmark::State& st, Run&& run,
                       double min_time = std::numeric_limits<double>::infinity()) {
    const auto loop_start = std::chrono::steady_clock::now();
    for (auto _ : st) time_round(run);
    const std::chrono::duration<double> loop = std::chrono::steady_clock::now() - loop_start;
    if (loop.count() >= min_time) {
      while (rounds() < kMinRounds) time_round(run);
    }
  }

  /// One round outside a benchmark's loop: `run(k)` timed for every kind k,
  /// round i (counted over every round recorded) starting from kind i mod n.
  template <class Run>
  void time_round(Run&& run) {
    const std::size_t round = rounds();
    for (std::size_t i = 0; i < kinds_.size(); ++i) {
      const std::size_t k = (round + i) % kinds_.size();
      const auto t0 = std::chrono::steady_clock::now();
      run(k);
      benchmark::ClobberMemory();
      add(k, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }

  /// Rounds recorded so far (calls of the last kind).
  [[nodiscard]] std::size_t rounds() const { return seconds_.back().size(); }

  /// The seconds of every call of `kind`, in round order.
  [[nodiscard]] const std::vector<double>& seconds(std::size_t kind) const {
    return seconds_[kind];
  }

  /// For every kind k, with t_k,i the time of its call in iteration i:
  /// `<k>_ms` the mean of t_k,i; `<k>_median_ms` their median; `<k>_speedup`
  /// mean(t_0) / mean(t_k); `<k>_median_speedup` the median over iterations
  /// of t_0,i / t_k,i and `<k>_speedup_p25`, `<k>_speedup_p75` its
  /// quartiles (the spread of the paired ratio); `paired_iterations`.
  void set_counters(benchmark::State& st) const {
    const double base = mean(seconds_[0]);
    for (std::size_t k = 0; k < kinds_.size(); ++k) {
      const std::string& name = kinds_[k];
      const double m = mean(seconds_[k]);
      std::vector<double> ratios;
      for (std::size_t i = 0; i < seconds_[k].size() && i < seconds_[0].size(); ++i)
        if (seconds_[k][i] > 0) ratios.push_back(seconds_[0][i] / seconds_[k][i]);
      st.counters[name + "_ms"] = m * 1e3;
      st.counters[name + "_median_ms"] = quantile(seconds_[k], 0.5) * 1e3;
      st.counters[name + "_speedup"] = m > 0 ? base / m : 0;
      st.counters[name + "_median_speedup"] = quantile(ratios, 0.5);
      st.counters[name + "_speedup_p25"] = quantile(ratios, 0.25);
      st.counters[name + "_speedup_p75"] = quantile(ratios, 0.75);
    }
    st.counters["paired_iterations"] = static_cast<double>(seconds_[0].size());
  }

  /// The counters of a benchmark whose result is one paired ratio: those of
  /// set_counters, and `median_speedup`, `speedup_p25`, `speedup_p75` (what
  /// the report reads) the median and quartiles over the rounds of
  /// t_0 / t_kind, times `scale`.
  void set_speedup_counters(benchmark::State& st, std::size_t kind, double scale = 1.0) const {
    set_counters(st);
    const std::string& name = kinds_[kind];
    st.counters["median_speedup"] = scale * st.counters[name + "_median_speedup"];
    st.counters["speedup_p25"] = scale * st.counters[name + "_speedup_p25"];
    st.counters["speedup_p75"] = scale * st.counters[name + "_speedup_p75"];
  }

  /// Mean seconds of one call of `kind` (0 when none was recorded).
  [[nodiscard]] double mean_seconds(std::size_t kind) const { return mean(seconds_[kind]); }

  [[nodiscard]] const std::vector<std::string>& kinds() const { return kinds_; }

  /// The q-quantile of x by linear interpolation between order statistics
  /// (0 for no values).
  static double quantile(std::vector<double> x, double q) {
    if (x.empty()) return 0;
    std::sort(x.begin(), x.end());
    const double pos = q * static_cast<double>(x.size() - 1);
    const auto lo = static_cast<std::size_t>(pos);
    const std::size_t hi = std::min(lo + 1, x.size() - 1);
    return x[lo] + (pos - static_cast<double>(lo)) * (x[hi] - x[lo]);
  }

 private:
  static double mean(const std::vector<double>& x) {
    double s = 0;
    for (const double v : x) s += v;
    return x.empty() ? 0 : s / static_cast<double>(x.size());
  }

  std::vector<std::string> kinds_;
  std::vector<std::vector<double>> seconds_;
};

/// Registers benchmark `spec` of calls timed in turn inside every round
/// (PairedTimes of kinds `kinds`, at least kMinRounds rounds in the reported
/// run): `make()` builds its fixture (cached across Google Benchmark's
/// runs), `run(fixture, k)` makes one call of kind k, `counters(st, times,
/// fixture)` sets the counters. A failure building it or in its warm-up (one
/// call of each kind) skips the benchmark with the message.
template <class Fixture, class Make, class Run, class Counters>
void add_paired_benchmark(const Spec& spec, std::vector<std::string> kinds, Make make, Run run,
                          Counters counters) {
  const double min_time = std::max(1.0, default_min_time());
  add(
      spec,
      [key = spec.name, kinds, make, run, counters, min_time](benchmark::State& st) {
        Fixture* x = nullptr;
        try {
          x = &cached_fixture<Fixture>(key, [&] { return std::make_unique<Fixture>(make()); });
          for (std::size_t k = 0; k < kinds.size(); ++k) run(*x, k);  // warm-up
        } catch (const std::exception& e) {
          st.SkipWithError(e.what());
          return;
        }
        PairedTimes times(kinds);
        times.time_iterations(
            st, [&](std::size_t k) { run(*x, k); }, min_time);
        counters(st, times, *x);
      },
      min_time);
}

}  // namespace tandem::bench
