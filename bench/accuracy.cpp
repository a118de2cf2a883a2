// SPDX-License-Identifier: Apache-2.0
// tandem_accuracy: the error of every backend against the reference run in
// double (reference<double>: double inputs, double arithmetic), on the same
// float32 inputs, for every op. Prints JSON for the performance report.
//
//   tandem_accuracy [--quick] [--threads=N] [--out=FILE]
//
// Per output it reports max_abs = max |got − exact|, rel_max = max_abs /
// max |exact| and rel_rms = ‖got − exact‖₂ / ‖exact‖₂. The attention block
// has no double instantiation; its exact value is the float reference, which
// keeps every intermediate in double and rounds once at the end.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tandem/reference/attention.hpp"
#include "tandem/reference/axial_rope.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/reference/rope.hpp"
#include "tandem/reference/swiglu.hpp"
#include "tandem/tandem.hpp"
#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace {

using tandem::Backend;
using Json = nlohmann::json;

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo = -1.f,
                                 float hi = 1.f) {
  std::vector<float> v(n);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = lo + (hi - lo) * static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
  }
  return v;
}

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

/// Error of `got` against `exact`.
Json error_of(const std::vector<float>& got, const std::vector<double>& exact) {
  double max_abs = 0, max_ref = 0, err2 = 0, ref2 = 0;
  bool finite = true;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(static_cast<double>(got[i]) - exact[i]);
    if (!std::isfinite(e)) finite = false;
    max_abs = std::max(max_abs, e);
    max_ref = std::max(max_ref, std::abs(exact[i]));
    err2 += e * e;
    ref2 += exact[i] * exact[i];
  }
  if (!finite)
    return {{"max_abs", nullptr}, {"rel_max", nullptr}, {"rel_rms", nullptr}, {"finite", false}};
  return {{"max_abs", max_abs},
          {"rel_max", max_ref > 0 ? max_abs / max_ref : max_abs},
          {"rel_rms", ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2)},
          {"finite", true}};
}

struct Runner {
  std::vector<Backend> backends;
  Json results = Json::array();

  /// Runs `fn(backend)` → outputs for every backend and records the errors
  /// of each output against `exact`.
  void compare(const std::string& op, const std::string& shape,
               const std::vector<std::string>& names, const std::vector<std::vector<double>>& exact,
               const std::function<std::vector<std::vector<float>>(const Backend&)>& fn) {
    for (const Backend& be : backends) {
      Json row{{"op", op}, {"shape", shape}, {"backend", be.name}};
      try {
        const auto got = fn(be);
        Json outs = Json::object();
        for (std::size_t i = 0; i < names.size(); ++i) outs[names[i]] = error_of(got[i], exact[i]);
        row["outputs"] = outs;
      } catch (const std::exception& e) {
        row["error"] = e.what();
      }
      std::cerr << "accuracy: " << op << " " << shape << " " << be.name << "\n";
      results.push_back(row);
    }
  }
};

void attention_cases(Runner& r, bool quick) {
  struct Case {
    std::int64_t B, H, Hkv, Sq, Sk, D;
    bool causal, backward;
  };
  std::vector<Case> cases;
  for (std::int64_t D : {64, 128}) {
    for (bool causal : {false, true}) {
      cases.push_back({1, 4, 4, 256, 256, D, causal, false});
      cases.push_back({1, 2, 2, 128, 128, D, causal, true});
      if (!quick) cases.push_back({1, 2, 2, 1024, 1024, D, causal, false});
    }
  }
  cases.push_back({1, 32, 8, 1, 1024, 128, false, false});  // decode, GQA
  for (const Case& c : cases) {
    tandem::AttentionParams p;
    p.B = c.B;
    p.Sq = c.Sq;
    p.Sk = c.Sk;
    p.H = c.H;
    p.Hkv = c.Hkv;
    p.D = c.D;
    p.mask = c.causal ? tandem::MaskKind::causal : tandem::MaskKind::none;
    const tandem::AttentionPlan plan = tandem::AttentionPlan::make(p);
    // Scores of a realistic spread: q, k in [-2, 2).
    const auto q = random_floats(static_cast<std::size_t>(plan.q.extent), 1, -2, 2);
    const auto k = random_floats(static_cast<std::size_t>(plan.k.extent), 2, -2, 2);
    const auto v = random_floats(static_cast<std::size_t>(plan.v.extent), 3);
    const auto dout = random_floats(static_cast<std::size_t>(plan.o.extent), 4);
    const auto qd = widen(q), kd = widen(k), vd = widen(v), doutd = widen(dout);
    const tandem::AttentionInputs<double> ind{qd, kd, vd, {}};
    const tandem::AttentionInputs<float> in{q, k, v, {}};
    std::string shape = "B" + std::to_string(c.B);
    shape += "_H" + std::to_string(c.H);
    if (c.Hkv != c.H) shape += "_Hkv" + std::to_string(c.Hkv);
    if (c.Sq == c.Sk) {
      shape += "_S" + std::to_string(c.Sq);
    } else {
      shape += "_Sq" + std::to_string(c.Sq);
      shape += "_Sk" + std::to_string(c.Sk);
    }
    shape += "_D" + std::to_string(c.D);
    if (c.causal) shape += "_causal";
    if (!c.backward) {
      std::vector<double> out(static_cast<std::size_t>(plan.o.extent));
      tandem::reference::attention_forward<double>(plan, ind, out);
      r.compare(c.Sq == 1 ? "decode" : "attention_forward", shape, {"out"}, {out},
                [&](const Backend& be) {
                  std::vector<float> o(out.size());
                  be.attention_forward(plan, in, o);
                  return std::vector<std::vector<float>>{o};
                });
    } else {
      std::vector<double> dq(static_cast<std::size_t>(plan.dq.extent)),
          dk(static_cast<std::size_t>(plan.dk.extent)),
          dv(static_cast<std::size_t>(plan.dv.extent));
      tandem::reference::attention_backward<double>(plan, ind, doutd, {dq, dk, dv});
      r.compare("attention_backward", shape, {"dq", "dk", "dv"}, {dq, dk, dv},
                [&](const Backend& be) {
                  std::vector<float> gq(dq.size()), gk(dk.size()), gv(dv.size());
                  be.attention_backward(plan, in, dout, {gq, gk, gv});
                  return std::vector<std::vector<float>>{gq, gk, gv};
                });
    }
  }
}

void rope_cases(Runner& r) {
  tandem::RopeParams p;
  p.batch = 2;
  p.seq = 128;
  p.width = 8 * 128;
  p.head_dim = 128;
  p.table_rows = 128;
  const tandem::RopePlan plan = tandem::RopePlan::make(p);
  const auto x = random_floats(static_cast<std::size_t>(plan.out_size()), 5);
  std::vector<float> cos(static_cast<std::size_t>(plan.R * plan.T)), sin(cos.size());
  for (std::int64_t row = 0; row < plan.R; ++row) {
    for (std::int64_t i = 0; i < plan.T; ++i) {
      const double a =
          static_cast<double>(row) * std::pow(10000.0, -2.0 * static_cast<double>(i) / 128.0);
      cos[static_cast<std::size_t>(row * plan.T + i)] = static_cast<float>(std::cos(a));
      sin[static_cast<std::size_t>(row * plan.T + i)] = static_cast<float>(std::sin(a));
    }
  }
  const auto xd = widen(x), cd = widen(cos), sd = widen(sin);
  const std::string shape = "B2_S128_H8_D128";
  for (bool fwd : {true, false}) {
    std::vector<double> out(x.size());
    if (fwd) {
      tandem::reference::rope_forward<double>(plan, xd, {cd, sd}, out);
    } else {
      tandem::reference::rope_backward<double>(plan, xd, {cd, sd}, out);
    }
    r.compare(fwd ? "rope_forward" : "rope_backward", shape, {fwd ? "out" : "dx"}, {out},
              [&](const Backend& be) {
                std::vector<float> o(x.size());
                (fwd ? be.rope_forward : be.rope_backward)(plan, x, {cos, sin}, o);
                return std::vector<std::vector<float>>{o};
              });
  }
}

void axial_cases(Runner& r) {
  tandem::AxialRopeParams p;
  p.batch = 2;
  p.seq = 32 * 32;
  p.width = 256;
  p.end_x = p.end_y = 32;
  const tandem::AxialRopePlan plan = tandem::AxialRopePlan::make(p);
  const auto x = random_floats(static_cast<std::size_t>(plan.out_size()), 6);
  const auto xd = widen(x);
  for (bool fwd : {true, false}) {
    std::vector<double> out(x.size());
    if (fwd) {
      tandem::reference::axial_rope_forward<double>(plan, xd, out);
    } else {
      tandem::reference::axial_rope_backward<double>(plan, xd, out);
    }
    r.compare(fwd ? "axial_rope_forward" : "axial_rope_backward", "B2_X32_Y32_W256_H1",
              {fwd ? "out" : "dx"}, {out}, [&](const Backend& be) {
                std::vector<float> o(x.size());
                (fwd ? be.axial_rope_forward : be.axial_rope_backward)(plan, x, o);
                return std::vector<std::vector<float>>{o};
              });
  }
}

void swiglu_cases(Runner& r) {
  const tandem::SwigluPlan plan = tandem::SwigluPlan::make({64, 1024, true});
  const auto x = random_floats(static_cast<std::size_t>(plan.in_size()), 7, -6, 6);
  const auto dy = random_floats(static_cast<std::size_t>(plan.out_size()), 8);
  const auto xd = widen(x), dyd = widen(dy);
  std::vector<double> y(dy.size()), dx(x.size());
  tandem::reference::swiglu_forward<double>(plan, xd, y);
  tandem::reference::swiglu_backward<double>(plan, xd, dyd, dx);
  r.compare("swiglu_forward", "rows64_n1024", {"out"}, {y}, [&](const Backend& be) {
    std::vector<float> o(y.size());
    be.swiglu_forward(plan, x, o);
    return std::vector<std::vector<float>>{o};
  });
  r.compare("swiglu_backward", "rows64_n1024", {"dx"}, {dx}, [&](const Backend& be) {
    std::vector<float> o(dx.size());
    be.swiglu_backward(plan, x, dy, o);
    return std::vector<std::vector<float>>{o};
  });
}

void block_cases(Runner& r) {
  tandem::AttentionBlockParams p;
  p.batch = 1;
  p.seq = 64;
  p.embed = 768;
  p.heads = 12;
  p.qkv_bias = p.out_bias = true;
  const tandem::AttentionBlockPlan plan = tandem::AttentionBlockPlan::make(p);
  const std::size_t E = 768;
  const float w = 1.0f / std::sqrt(768.0f);
  const auto x = random_floats(static_cast<std::size_t>(plan.x_size()), 9);
  const auto wqkv = random_floats(3 * E * E, 10, -w, w),
             bqkv = random_floats(3 * E, 11, -0.1f, 0.1f);
  const auto wout = random_floats(E * E, 12, -w, w), bout = random_floats(E, 13, -0.1f, 0.1f);
  const tandem::AttentionBlockInputs<float> in{x, wqkv, bqkv, wout, bout, {}, {}, {}};
  std::vector<float> exact_f(x.size());
  tandem::reference::backend().attention_block(plan, in, exact_f);
  r.compare("attention_block", "B1_S64_E768_H12", {"out"}, {widen(exact_f)},
            [&](const Backend& be) {
              std::vector<float> o(x.size());
              be.attention_block(plan, in, o);
              return std::vector<std::vector<float>>{o};
            });
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int threads = 0;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a.rfind("--threads=", 0) == 0) {
      threads = std::atoi(a.c_str() + 10);
    } else if (a.rfind("--out=", 0) == 0) {
      out_path = a.substr(6);
    } else {
      std::cerr << "usage: tandem_accuracy [--quick] [--threads=N] [--out=FILE]\n";
      return 2;
    }
  }
  Runner r;
  r.backends.push_back(tandem::reference::backend());
#ifdef TANDEM_HAVE_OPTIMIZED
  r.backends.push_back(tandem::optimized::backend(tandem::optimized::Options{threads}));
#else
  (void)threads;
#endif
  attention_cases(r, quick);
  rope_cases(r);
  axial_cases(r);
  swiglu_cases(r);
  block_cases(r);
  const std::string text = Json{{"results", r.results}}.dump(1);
  if (out_path.empty()) {
    std::cout << text << "\n";
  } else {
    std::ofstream f(out_path);
    f << text << "\n";
    if (!f) {
      std::cerr << "tandem_accuracy: cannot write " << out_path << "\n";
      return 1;
    }
  }
  return 0;
}
