// SPDX-License-Identifier: Apache-2.0
// The table of page 13 ("Where precision goes in attention"): the error of
// attention stored in f32, bf16 and f16 (the reference, `pytorch` profile)
// against the exact attention of the same stored inputs (the reference in
// double), for growing Sk, beside the bound of SPEC §10.5.
//
//   tandem_docs_precision <out.md>     writes the table (the docs build)
//   tandem_docs_precision --check      fails unless every error is within the
//                                      bound and the errors do not grow with Sk
//                                      (CTest docs_precision_errors)
//
// The inputs are N(0, 1) rounded to bf16, so every storage type holds the
// same values and the errors are the arithmetic's alone.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tandem/reference/backend.hpp"
#include "tandem/reference/kernels.hpp"
#include "tandem/tandem.hpp"

namespace {

using std::int64_t;

/// One storage type's error against exact arithmetic at one Sk.
struct Row {
  double max_err = 0;    ///< max_i,d |o − o_exact|
  double max_ratio = 0;  ///< max_i,d |o − o_exact| / (u|o_exact| + u Σ_j p_ij |v_jd|)
};

/// out = attention(q, k, v) of `plan` at storage type T, widened to double.
template <class T>
std::vector<double> attend(const tandem::Backend& ref, const tandem::AttentionPlan& plan,
                           const std::vector<double>& q, const std::vector<double>& k,
                           const std::vector<double>& v) {
  const auto as_t = [](const std::vector<double>& x) {
    std::vector<T> y;
    for (double d : x) y.push_back(T(d));
    return y;
  };
  const auto qt = as_t(q), kt = as_t(k), vt = as_t(v);
  std::vector<T> o(static_cast<std::size_t>(plan.o.extent));
  const auto& fn = ref.kernels<T>().attention_forward;
  if (!fn) throw std::runtime_error("the reference does not offer attention_forward at this type");
  fn(plan, {qt, kt, vt}, o);
  std::vector<double> out;
  for (const T& x : o) out.push_back(static_cast<double>(x));
  return out;
}

struct Table {
  std::vector<int64_t> sk;
  std::vector<Row> f32, bf16, f16;
};

Table compute() {
  const tandem::Backend ref = tandem::reference::backend();
  const auto exact = tandem::reference::kernels<double, double>();
  Table t;
  std::mt19937_64 rng(13);
  std::normal_distribution<double> normal;
  for (int64_t sk : {16, 128, 1024, 8192}) {
    tandem::AttentionParams p;
    p.B = 1;
    p.Sq = 4;
    p.Sk = sk;
    p.H = 2;
    p.Hkv = 2;
    p.D = 64;
    const auto plan = tandem::AttentionPlan::make(p);
    const auto draw = [&](int64_t n) {
      std::vector<double> x(static_cast<std::size_t>(n));
      for (double& d : x) d = static_cast<double>(tandem::bfloat16(normal(rng)));
      return x;
    };
    const auto q = draw(plan.q.extent), k = draw(plan.k.extent), v = draw(plan.v.extent);
    std::vector<double> abs_v(v.size());
    std::transform(v.begin(), v.end(), abs_v.begin(), [](double x) { return std::fabs(x); });
    std::vector<double> o(static_cast<std::size_t>(plan.o.extent)),
        pv(static_cast<std::size_t>(plan.o.extent));
    exact.attention_forward(plan, {q, k, v}, o);       // the exact attention
    exact.attention_forward(plan, {q, k, abs_v}, pv);  // Σ_j p_ij |v_jd|
    const auto row = [&](const std::vector<double>& got, double u) {
      Row r;
      for (std::size_t i = 0; i < o.size(); ++i) {
        const double err = std::fabs(got[i] - o[i]);
        r.max_err = std::max(r.max_err, err);
        r.max_ratio = std::max(r.max_ratio, err / (u * std::fabs(o[i]) + u * pv[i]));
      }
      return r;
    };
    t.sk.push_back(sk);
    t.f32.push_back(row(attend<float>(ref, plan, q, k, v), 0x1p-24));
    t.bf16.push_back(row(attend<tandem::bfloat16>(ref, plan, q, k, v), 0x1p-8));
    t.f16.push_back(row(attend<tandem::float16>(ref, plan, q, k, v), 0x1p-11));
  }
  return t;
}

std::string markdown(const Table& t) {
  std::string s =
      "| Sk | f32: max error | (÷ bound) | bf16: max error | (÷ bound) | f16: max error | "
      "(÷ bound) |\n|---|---|---|---|---|---|---|\n";
  char line[256];
  for (std::size_t i = 0; i < t.sk.size(); ++i) {
    std::snprintf(line, sizeof line, "| %lld | %.2e | %.2f | %.2e | %.2f | %.2e | %.2f |\n",
                  static_cast<long long>(t.sk[i]), t.f32[i].max_err, t.f32[i].max_ratio,
                  t.bf16[i].max_err, t.bf16[i].max_ratio, t.f16[i].max_err, t.f16[i].max_ratio);
    s += line;
  }
  return s;
}

/// Every error within its bound (ratio <= 1) and none growing with Sk: the
/// largest error at the longest Sk is at most twice the shortest's.
int check(const Table& t) {
  int failed = 0;
  for (const auto* rows : {&t.f32, &t.bf16, &t.f16}) {
    for (std::size_t i = 0; i < rows->size(); ++i) {
      if ((*rows)[i].max_ratio > 1.0) {
        std::fprintf(stderr, "error above the SPEC §10.5 bound at Sk = %lld\n",
                     static_cast<long long>(t.sk[i]));
        ++failed;
      }
    }
    if (rows->back().max_err > 2 * rows->front().max_err) {
      std::fprintf(stderr, "the error grows with Sk\n");
      ++failed;
    }
  }
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tandem_docs_precision <out.md> | --check\n");
    return 2;
  }
  const std::string arg = argv[1];
  try {
    const Table t = compute();
    if (arg == "--check") {
      std::fputs(markdown(t).c_str(), stdout);
      return check(t) == 0 ? 0 : 1;
    }
    std::ofstream(arg) << markdown(t);
    return 0;
  } catch (const std::exception& e) {
    if (arg == "--check") {
      std::fprintf(stderr, "tandem_docs_precision: %s\n", e.what());
      return 1;
    }
    std::ofstream(arg) << "(This site was built with a reference that does not offer bf16 and "
                          "f16 attention, so the table could not be computed: "
                       << e.what() << ".)\n";
    return 0;
  }
}
