// SPDX-License-Identifier: Apache-2.0
#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "broken/broken.hpp"
#include "tandem/reference/backend.hpp"
#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace tandem::props {

double max_abs(std::span<const double> x) {
  double m = 0;
  for (double v : x) {
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  }
  return m;
}

double max_err(std::span<const double> got, std::span<const double> exp) {
  double m = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool gn = std::isnan(got[i]), en = std::isnan(exp[i]);
    if (gn && en) continue;
    if (gn != en) return std::numeric_limits<double>::infinity();
    if (got[i] == exp[i]) continue;  // equal infinities
    m = std::max(m, std::abs(got[i] - exp[i]));
  }
  return m;
}

std::string same_bits_on_every_run(const Subject& s,
                                   const std::function<Outputs(const Backend&)>& replay,
                                   const std::string& what) {
  const Outputs first = replay(s.backend);
  std::vector<const Backend*> runs{&s.backend};
  for (const Backend& v : s.thread_variants) runs.push_back(&v);
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const Outputs again = replay(*runs[r]);
    const std::string run =
        r == 0 ? " on a repeated call" : " with thread variant " + std::to_string(r);
    if (again.size() != first.size()) return what + ": a different number of outputs" += run;
    for (std::size_t i = 0; i < first.size(); ++i) {
      std::string name = what + " output ";
      name += std::to_string(i);
      name += run;
      std::string m = bit_mismatch(name, again[i], first[i]);
      if (!m.empty()) return m;
    }
  }
  return {};
}

Subject fixture_subject(broken::Bug bug) {
  Subject s;
  s.name = std::string("broken_") + broken::to_string(bug);
  s.backend = broken::backend(bug, 1);
  for (int t = 1; t <= 3; ++t) s.thread_variants.push_back(broken::backend(bug, t));
  return s;
}

#ifdef TANDEM_HAVE_OPTIMIZED
namespace {

/// The optimized backend at `geo`, at `target`: default threads, with the
/// variants at 1, 2 and 3 threads.
Subject optimized_subject(std::int64_t target, const std::string& name,
                          const optimized::Geometry& geo) {
  Subject s;
  s.name = name;
  s.backend = optimized::backend(optimized::Options{0, geo});
  for (int t = 1; t <= 3; ++t)
    s.thread_variants.push_back(optimized::backend(optimized::Options{t, geo}));
  s.enter = [target] { optimized::force_target(target); };
  s.leave = [] { optimized::force_target(0); };
  s.invariant = geo.invariant;
  return s;
}

/// A random Geometry with invariant set (every field in its range, the
/// split-key decode forced on or off) at 1 to 3 threads, and its description.
std::pair<Backend, std::string> random_invariant_backend() {
  optimized::Geometry g;
  g.invariant = true;
  g.key_block = *rc::gen::element<std::int64_t>(1, 2, 3, 7, 16, 64, 100, 4096);
  g.edge_block = *rc::gen::inRange<std::int64_t>(1, g.key_block + 1);
  g.rows_per_tile = *rc::gen::element<std::int64_t>(1, 2, 5, 8, 64, 384, 1000);
  g.rows_per_tile_banded = *rc::gen::element<std::int64_t>(1, 3, 8, 192, 700);
  g.decode_tiles = *rc::gen::element(optimized::DecodeTiles::one_vector,
                                     optimized::DecodeTiles::never, optimized::DecodeTiles::always);
  const bool split = *rc::gen::arbitrary<bool>();
  g.split_keys_chunk = *rc::gen::element<std::int64_t>(0, 1, 3, 64, 500, 1024, 2048);
  g.split_keys_min_chunks = split ? *rc::gen::element<std::int64_t>(1, 2) : 0;
  g.split_keys_step = *rc::gen::element<std::int64_t>(1, 2, 8, 33);
  g.split_keys_contiguous_heads =
      split ? std::int64_t{1} << 20 : *rc::gen::element<std::int64_t>(0, 4);
  g.backward_min_tasks = *rc::gen::element<std::int64_t>(1, 6, 8, 64);
  g.backward_query_parts = *rc::gen::element<std::int64_t>(0, 1, 2, 3, 5);
  const int threads = *rc::gen::inRange(1, 4);
  std::ostringstream os;
  os << "Geometry{key_block " << g.key_block << ", edge_block " << g.edge_block
     << ", rows_per_tile " << g.rows_per_tile << ", rows_per_tile_banded " << g.rows_per_tile_banded
     << ", decode_tiles " << static_cast<int>(g.decode_tiles) << ", split_keys chunk "
     << g.split_keys_chunk << " min_chunks " << g.split_keys_min_chunks << " step "
     << g.split_keys_step << " contiguous_heads " << g.split_keys_contiguous_heads
     << ", backward min_tasks " << g.backward_min_tasks << " query_parts " << g.backward_query_parts
     << ", invariant} at " << threads << " threads";
  return {optimized::backend(optimized::Options{threads, g}), os.str()};
}

/// Small geometries of the optimized attention (optimized::Geometry): cases
/// of a dozen keys and queries cross every key block, edge block, query
/// tile, split-key chunk and backward query part, and shrink to
/// counterexamples of that size. A call takes the wide tile or the decode
/// tile, hence two:
///  - small: blocks of 3 keys (2 at a causal or window edge), tiles of 5
///    query rows (3 under a band), every tile wide even for one query row,
///    the backward in 3 query parts;
///  - small_decode: blocks of 2 keys (1 at an edge), tiles of 4 rows (2),
///    every tile by the decode algorithm, split-key decode from 2 chunks of
///    3 keys stepped 2 at a time whatever the layout, the backward in as
///    many parts as 6 tasks need.
/// Both keep key blocks shorter than the micro-kernel's rows, and tiles
/// narrower than a vector at every target but the scalar one.
std::vector<std::pair<std::string, optimized::Geometry>> small_geometries() {
  optimized::Geometry wide;
  wide.key_block = 3;
  wide.edge_block = 2;
  wide.rows_per_tile = 5;
  wide.rows_per_tile_banded = 3;
  wide.decode_tiles = optimized::DecodeTiles::never;
  wide.backward_query_parts = 3;
  optimized::Geometry decode;
  decode.key_block = 2;
  decode.edge_block = 1;
  decode.rows_per_tile = 4;
  decode.rows_per_tile_banded = 2;
  decode.decode_tiles = optimized::DecodeTiles::always;
  decode.split_keys_chunk = 3;
  decode.split_keys_min_chunks = 2;
  decode.split_keys_step = 2;
  decode.split_keys_contiguous_heads = std::int64_t{1} << 20;
  decode.backward_min_tasks = 6;
  return {{"small", wide}, {"small_decode", decode}};
}

}  // namespace
#endif

std::vector<Subject> correct_subjects() {
  std::vector<Subject> out;
  {
    Subject s;
    s.name = "reference";
    s.backend = reference::backend();
    s.thread_variants = {reference::backend()};
    out.push_back(s);
  }
  out.push_back(fixture_subject(broken::Bug::none));
#ifdef TANDEM_HAVE_OPTIMIZED
  const std::vector<std::int64_t> targets = optimized::supported_targets();
  for (std::int64_t target : targets) {
    out.push_back(optimized_subject(target, "optimized_" + optimized::target_name(target), {}));
  }
  // The small geometries at every target too: the geometry's logic is the
  // same at every target but for the lane count, which sets the padding of a
  // tile's rows and which tiles fit one vector, and the micro-kernel's rows.
  for (std::int64_t target : targets) {
    for (const auto& [name, geo] : small_geometries()) {
      Subject s = optimized_subject(
          target, "optimized_" + optimized::target_name(target) + "_" + name, geo);
      s.attention_only = true;
      out.push_back(s);
    }
  }
  // Every target with Geometry::invariant set, at the default geometry and
  // the small ones (whose blocks and tiles invariant must override): the
  // invariance properties (SPEC §12) run there, and only they.
  for (std::int64_t target : targets) {
    std::vector<std::pair<std::string, optimized::Geometry>> geos = {{"", {}}};
    for (const auto& g : small_geometries()) geos.push_back(g);
    for (auto [geo_name, geo] : geos) {
      geo.invariant = true;
      std::string name = "optimized_" + optimized::target_name(target);
      if (!geo_name.empty()) name += "_" + geo_name;
      Subject s = optimized_subject(target, name + "_invariant", geo);
      s.invariance_only = true;
      s.invariant_variant = random_invariant_backend;
      out.push_back(s);
    }
  }
  // The best target once more with the bf16 forward's AVX512-BF16 products
  // switched on (off by default), where this CPU has them: at the default
  // geometry and at the small wide one, whose many key blocks per tile reach
  // the kernels' running output.
  if (optimized::bf16_dot_supported() && !targets.empty()) {
    const std::int64_t best = targets.front();
    const std::string name = "optimized_" + optimized::target_name(best) + "_bf16dot";
    for (const auto& [geo_name, geo] :
         {std::pair<std::string, optimized::Geometry>{"", {}}, small_geometries().front()}) {
      Subject s = optimized_subject(best, geo_name.empty() ? name : name + "_" + geo_name, geo);
      s.attention_only = !geo_name.empty();
      s.enter = [best] {
        optimized::force_target(best);
        optimized::enable_bf16_dot(true);
      };
      s.leave = [] {
        optimized::enable_bf16_dot(false);
        optimized::force_target(0);
      };
      out.push_back(s);
    }
  }
#endif
  return out;
}

void register_attention_properties(std::vector<Property>& out);
void register_feature_properties(std::vector<Property>& out);
void register_bias_properties(std::vector<Property>& out);
void register_rope_properties(std::vector<Property>& out);
void register_other_properties(std::vector<Property>& out);
void register_lowp_properties(std::vector<Property>& out);
void register_plan_properties(std::vector<Property>& out);
void register_invariance_properties(std::vector<Property>& out);
void register_flex_properties(std::vector<Property>& out);

const std::vector<Property>& properties() {
  static const std::vector<Property> all = [] {
    std::vector<Property> v;
    register_attention_properties(v);
    register_feature_properties(v);
    register_bias_properties(v);
    register_rope_properties(v);
    register_other_properties(v);
    register_lowp_properties(v);
    register_plan_properties(v);
    register_invariance_properties(v);
    register_flex_properties(v);
    return v;
  }();
  return all;
}

const Property& property(const std::string& name) {
  for (const Property& p : properties()) {
    if (p.name == name) return p;
  }
  throw std::out_of_range("no property named " + name);
}

int case_count(const Property& p) {
  const char* rc_params = std::getenv("RC_PARAMS");
  if (rc_params != nullptr && std::string(rc_params).find("max_success") != std::string::npos) {
    return rc::detail::configuration().testParams.maxSuccess;
  }
  double scale = 1.0;
  if (const char* s = std::getenv("TANDEM_PROPS_SCALE")) scale = std::atof(s);
  return std::max(1, static_cast<int>(std::lround(p.cases * scale)));
}

namespace {
class SilentListener : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};
}  // namespace

std::string run_property(const Property& p, const Subject& s, int cases, bool quiet,
                         std::optional<std::uint64_t> seed) {
  using namespace rc::detail;
  TestParams params = configuration().testParams;
  params.maxSuccess = cases;
  if (seed) params.seed = *seed;
  TestMetadata md;
  md.id = s.name + "/" + p.name;
  md.description = p.name + " on " + s.name;
  const auto body = [&p, &s] { p.body(s); };
  const std::unordered_map<std::string, Reproduce> no_reproduce;
  const auto check = [&]() -> TestResult {
    if (quiet) {
      params.disableShrinking = true;
      SilentListener listener;
      return checkProperty(toProperty(body), md, params, listener, no_reproduce);
    }
    return checkProperty(toProperty(body), md, params);
  };
  s.enter();
  std::optional<TestResult> maybe;
  try {
    maybe.emplace(check());
  } catch (...) {
    s.leave();
    throw;
  }
  s.leave();
  const TestResult& result = *maybe;
  if (result.template is<SuccessResult>()) return {};
  std::ostringstream os;
  printResultMessage(result, os);
  std::string msg = os.str();
  if (msg.empty()) msg = "failed";
  return msg;
}

}  // namespace tandem::props
