// SPDX-License-Identifier: Apache-2.0
// tandem_bench: Google Benchmark runs of every tandem op and backend, named
// `<op>/<backend>/<shape>`, with GFLOP/s or GB/s counters and their fraction
// of this machine's roofline (fp32 FMA peak, copy bandwidth) measured by
// the same binary.
//
// Flags of its own (everything else goes to Google Benchmark):
//   --preset=quick|standard|full   which set of shapes (default standard)
//   --threads=N                    threads of the optimized backend (default:
//                                  TANDEM_THREADS, else every core)
//   --scaling_threads=1,2,...      thread counts of the scaling runs
//                                  (default 1, 2, 4, ... up to every core)
//   --ops=a,b   --backends=a,b     restrict the ops / backends
//   --seqs=1024,2048 --dims=64,128 attention sequence lengths / head widths
//   --min_time=S                   minimum seconds per benchmark
//   --roofline=T:GFLOPS:GBS[:READ],...  use these peaks (FMA, copy, read)
//                                  instead of measuring them
//   --target=AVX2                  run the optimized backend and the roofline
//                                  probe on this Highway target (one of the
//                                  CPU's; default: TANDEM_TARGET, else the
//                                  best), e.g. the AVX2 path on an AVX-512 CPU
//   --plan                         print the planned benchmarks as JSON, exit
#include <hwy/highway.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "tandem/version.hpp"
#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace tandem::bench {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "tandem_bench: " << msg << "\n";
  std::exit(2);
}

int parse_int(const std::string& s, const std::string& flag, long max = 4096) {
  try {
    std::size_t pos = 0;
    const long v = std::stol(s, &pos);
    if (pos != s.size() || v < 1 || v > max) throw std::invalid_argument(s);
    return static_cast<int>(v);
  } catch (const std::exception&) {
    usage_error(flag + " = " + s + " must be an integer in [1, " + std::to_string(max) + "]");
  }
}

double parse_double(const std::string& s, const std::string& flag) {
  try {
    std::size_t pos = 0;
    const double v = std::stod(s, &pos);
    if (pos != s.size() || !(v > 0)) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    usage_error(flag + " = " + s + " must be a positive number");
  }
}

/// Dispatches the optimized backend and the roofline probe (every Highway
/// dispatch of the process) to the target named `name`.
void force_target(const std::string& name) {
#ifdef TANDEM_HAVE_OPTIMIZED
  try {
    tandem::optimized::force_target(tandem::optimized::target_named(name));
  } catch (const tandem::Error& e) {
    usage_error(std::string("--") + e.what());
  }
#else
  usage_error("--target needs the optimized backend (not built)");
#endif
}

/// Takes tandem's own flags out of argv (so Google Benchmark sees only its own).
void parse_flags(int* argc, char** argv) {
  Config& c = config();
#ifdef TANDEM_HAVE_OPTIMIZED
  try {  // TANDEM_TARGET before the roofline probe runs (--target overrides it)
    tandem::optimized::force_environment_target();
  } catch (const tandem::Error& e) {
    usage_error(e.what());
  }
#endif
  if (const char* env = std::getenv("TANDEM_THREADS"); env && *env) {
    c.threads = parse_int(env, "TANDEM_THREADS");
  }
  std::string scaling;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (name == "--preset") {
      if (v == "quick")
        c.preset = Preset::quick;
      else if (v == "standard")
        c.preset = Preset::standard;
      else if (v == "full")
        c.preset = Preset::full;
      else
        usage_error("--preset = " + v + " must be quick, standard or full");
    } else if (name == "--threads") {
      c.threads = parse_int(v, "--threads");
    } else if (name == "--scaling_threads") {
      scaling = v;
    } else if (name == "--ops") {
      c.ops = split(v, ',');
    } else if (name == "--backends") {
      c.backends = split(v, ',');
    } else if (name == "--seqs") {
      for (const auto& s : split(v, ',')) c.seqs.push_back(parse_int(s, "--seqs", 1L << 30));
    } else if (name == "--dims") {
      for (const auto& s : split(v, ',')) c.dims.push_back(parse_int(s, "--dims", 1L << 20));
    } else if (name == "--min_time") {
      c.min_time = parse_double(v, "--min_time");
    } else if (name == "--roofline") {
      for (const auto& entry : split(v, ',')) {
        const auto f = split(entry, ':');
        if (f.size() != 3 && f.size() != 4) {
          usage_error("--roofline entry " + entry + " must be THREADS:GFLOPS:GBS[:READ_GBS]");
        }
        const int t = parse_int(f[0], "--roofline threads");
        c.peak_gflops[t] = parse_double(f[1], "--roofline GFLOP/s");
        c.copy_gbs[t] = parse_double(f[2], "--roofline GB/s");
        if (f.size() == 4) c.read_gbs[t] = parse_double(f[3], "--roofline read GB/s");
      }
    } else if (name == "--target") {
      force_target(v);
    } else if (arg == "--plan") {
      c.print_plan = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  const int cores = available_cores();
  if (c.threads == 0) c.threads = cores;
  if (!scaling.empty()) {
    for (const auto& s : split(scaling, ','))
      c.scaling_threads.push_back(parse_int(s, "--scaling_threads"));
  } else {
    for (int t = 1; t < cores; t *= 2) c.scaling_threads.push_back(t);
    c.scaling_threads.push_back(cores);
  }
  std::sort(c.scaling_threads.begin(), c.scaling_threads.end());
  c.scaling_threads.erase(std::unique(c.scaling_threads.begin(), c.scaling_threads.end()),
                          c.scaling_threads.end());
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

std::string optimized_target() {
#ifdef TANDEM_HAVE_OPTIMIZED
  return tandem::optimized::current_target();
#else
  return "(optimized backend not built)";
#endif
}

std::string optimized_supported() {
#ifdef TANDEM_HAVE_OPTIMIZED
  std::string s;
  for (std::int64_t t : tandem::optimized::supported_targets()) {
    if (!s.empty()) s += ',';
    s += tandem::optimized::target_name(t);
  }
  return s;
#else
  return "";
#endif
}

const char* preset_name(Preset p) {
  switch (p) {
    case Preset::quick:
      return "quick";
    case Preset::standard:
      return "standard";
    case Preset::full:
      return "full";
  }
  return "?";
}

void add_context() {
  const Config& c = config();
  benchmark::AddCustomContext("tandem_version", tandem::version);
  benchmark::AddCustomContext("cpu_model", cpu_model());
  benchmark::AddCustomContext("cores", std::to_string(available_cores()));
  benchmark::AddCustomContext("threads", std::to_string(c.threads));
  benchmark::AddCustomContext("preset", preset_name(c.preset));
  benchmark::AddCustomContext("optimized_target", optimized_target());
  benchmark::AddCustomContext("optimized_supported_targets", optimized_supported());
  benchmark::AddCustomContext("roofline_target", roofline_target());
  benchmark::AddCustomContext("compiler", "GCC-compatible " __VERSION__);
  benchmark::AddCustomContext("highway_version", std::to_string(HWY_MAJOR) + "." +
                                                     std::to_string(HWY_MINOR) + "." +
                                                     std::to_string(HWY_PATCH));
#ifdef _OPENMP
  benchmark::AddCustomContext("openmp", std::to_string(_OPENMP));
#endif
}

/// A reporter that prints each benchmark under the name it was registered
/// with (`<op>/<backend>/<shape>`), without the `/min_time:…/real_time`
/// decorations Google Benchmark appends.
template <class Base>
class PlainNames : public Base {
 public:
  using Base::Base;
  void ReportRuns(const std::vector<benchmark::BenchmarkReporter::Run>& runs) override {
    std::vector<benchmark::BenchmarkReporter::Run> plain = runs;
    for (auto& r : plain) {
      r.run_name.min_time.clear();
      r.run_name.min_warmup_time.clear();
      r.run_name.iterations.clear();
      r.run_name.time_type.clear();
    }
    Base::ReportRuns(plain);
  }
};

std::unique_ptr<benchmark::BenchmarkReporter> make_reporter(const std::string& format, bool tty) {
  if (format == "json") return std::make_unique<PlainNames<benchmark::JSONReporter>>();
  using CR = benchmark::ConsoleReporter;
  return std::make_unique<PlainNames<CR>>(tty ? CR::OO_Defaults : CR::OO_Tabular);
}

/// Value of `--name=value` in argv, or `fallback`.
std::string flag_value(int argc, char** argv, const std::string& name,
                       const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  std::string v = fallback;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) v = a.substr(prefix.size());
  }
  return v;
}

void print_plan() {
  const Config& c = config();
  nlohmann::json j;
  j["preset"] = preset_name(c.preset);
  j["threads"] = c.threads;
  j["cores"] = available_cores();
  j["scaling_threads"] = c.scaling_threads;
  j["optimized_target"] = optimized_target();
  j["optimized_supported_targets"] = optimized_supported();
  j["roofline_target"] = roofline_target();
  j["cpu_model"] = cpu_model();
  j["compiler"] = std::string("GCC-compatible ") + __VERSION__;
  j["highway_version"] =
      std::to_string(HWY_MAJOR) + "." + std::to_string(HWY_MINOR) + "." + std::to_string(HWY_PATCH);
  j["tandem_version"] = tandem::version;
  nlohmann::json list = nlohmann::json::array();
  for (const Spec& s : plan()) {
    list.push_back({{"name", s.name},
                    {"op", s.op},
                    {"backend", s.backend},
                    {"shape", s.shape},
                    {"threads", s.threads},
                    {"params", s.params},
                    {"tags", s.tags}});
  }
  j["benchmarks"] = list;
  std::cout << j.dump(1) << "\n";
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  using namespace tandem::bench;
  // A fixed mmap threshold: large buffers go straight back to the system
  // when freed, so the peak-RSS probe sees what each call really needs.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  parse_flags(&argc, argv);
  register_roofline();
  register_attention();
  register_features();
  register_flex();
  register_streaming();
  register_block();
  register_decode_stored();
  register_low_precision();
  register_invariance();
  if (config().print_plan) {
    print_plan();
    return 0;
  }
  add_context();
  const std::string display_format = flag_value(argc, argv, "benchmark_format", "console");
  const std::string out_path = flag_value(argc, argv, "benchmark_out", "");
  const std::string out_format = flag_value(argc, argv, "benchmark_out_format", "json");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  auto display = make_reporter(display_format, isatty(1) != 0);
  if (out_path.empty()) {
    benchmark::RunSpecifiedBenchmarks(display.get());
  } else {
    auto file = make_reporter(out_format, false);
    benchmark::RunSpecifiedBenchmarks(display.get(), file.get());
  }
  benchmark::Shutdown();
  return 0;
}
