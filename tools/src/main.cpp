// SPDX-License-Identifier: Apache-2.0
// The `tandem` command: checks case directories against the backends
// (`tandem check`) and writes a backend's outputs as .npy (`tandem run`).
// Exit codes: 0 all pass, 1 any mismatch, 2 any case could not be run.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "case.hpp"
#ifdef TANDEM_TOOL_HAVE_OPTIMIZED
#include "tune.hpp"
#endif
#include "tandem/reference/backend.hpp"
#include "tandem/version.hpp"
#ifdef TANDEM_TOOL_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace {

using tandem::Backend;
using namespace tandem::tool;

constexpr int kPass = 0, kMismatch = 1, kCannotRun = 2;

/// Thrown for a backend the user asked for that cannot be had.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool optimized_compiled_in() {
#ifdef TANDEM_TOOL_HAVE_OPTIMIZED
  return true;
#else
  return false;
#endif
}

std::vector<Backend> make_backends(const std::string& which) {
  std::vector<Backend> out;
  if (which == "reference" || which == "all") out.push_back(tandem::reference::backend());
  if (which == "optimized" || which == "all") {
#ifdef TANDEM_TOOL_HAVE_OPTIMIZED
    out.push_back(tandem::optimized::backend());
#else
    if (which == "optimized") {
      throw UsageError(
          "backend 'optimized' is not available: this tandem was built without it "
          "(TANDEM_WITH_OPTIMIZED=OFF or the optimized library missing)");
    }
#endif
  }
  return out;
}

std::string help_footer() {
  std::string s =
      "Cases: a directory holding case.json and .npy files (SPEC section 9).\n"
      "An output passes when every element has |got - exp| <= atol + rtol*|exp|;\n"
      "NaN matches only NaN, +-inf only itself. A case's \"tolerance\" overrides\n"
      "the defaults, which are (float32; flex_*: the float32 arithmetic term of a\n"
      "tolerance derived per case, SPEC section 9.7):\n\n";
  s += fmt::format("  {:<23} {:>7} {:>7}  {:<9} {}\n", "op", "rtol", "atol", "outputs",
                   "inputs ([optional])");
  for (const auto& op : op_table()) {
    std::string inputs;
    for (const auto& n : op.required_inputs) inputs += (inputs.empty() ? "" : ",") + n;
    for (const auto& n : op.optional_inputs) inputs += (inputs.empty() ? "[" : ",[") + n + "]";
    std::string outputs;
    for (const auto& n : op.outputs) outputs += (outputs.empty() ? "" : ",") + n;
    s += fmt::format("  {:<23} {:>7.0e} {:>7.0e}  {:<9} {}\n", op.name, op.tolerance.rtol,
                     op.tolerance.atol, outputs, inputs);
  }
  s += "\nAttrs (default):\n"
       "  attention*       num_heads (required), layout bshd|bhsd (from shapes),\n"
       "                   mask none|causal|sliding_window|key_padding|bias (none),\n"
       "                   window (0), scale (1/sqrt(D)), softcap (0)\n"
       "  rope*            layout bshd|bhsd|thd (rank 4: or from num_heads), num_heads,\n"
       "                   head_dim (the last dim with a head axis, else W/num_heads),\n"
       "                   n_rot (head_dim), style neox|gptj (neox),\n"
       "                   table_rows position|token|position_ids (from shapes, positions)\n"
       "  axial_rope*      num_heads (1), end_x, end_y (required), theta (10000),\n"
       "                   repeat_factor (1)\n"
       "  swiglu*          gate_first (true)\n"
       "  attention_block  num_heads (required)\n"
       "  flex_attention*  score_mod, mask_mod (node lists; their tensors are inputs),\n"
       "                   scale (1/sqrt(D)), block_size (128, or [q, kv]) with a block\n"
       "                   mask kv_num_blocks, kv_indices [, full_*] (SPEC section 9.7)\n"
       "\nAttention features (SPEC section 2.7-2.10) are on when their inputs are given:\n"
       "sinks [H], alibi_slopes [H] or [n, H], cu_seqlens_q/k [n+1] (+ seqused_k [n])\n"
       "for packed q [total_q, H, D], block_table [B, max_blocks] + cache_seqlens [B] for\n"
       "paged k, v [num_blocks, block_size, Hkv, D]; key_origin [n] (one per sequence) says\n"
       "where each sequence's key 0 sits (SPEC section 12.1); index inputs are <i4 or <i8.\n"
       "\nStorage (SPEC section 9.4, 10): \"dtype\": f32 (default), bf16 (tensors as <u2 bits)\n"
       "or f16 (<f2); attention's \"rounding\": pytorch (default), exact or ggml; attention's\n"
       "attrs.kv_cache int8|e4m3 reads k, v as codes (|i1, |u1) with k_scale, v_scale (<f4).\n"
       "bf16/f16 tolerances are derived from SPEC section 10.5 (section 9.5).\n"
       "\nExit status: 0 all pass, 1 any mismatch, 2 any case could not be run.\n";
  return s;
}

struct Row {
  std::string case_name, backend, output;
  double max_abs = 0, max_rel = 0;
  std::string verdict;  // "pass", "FAIL", "ERROR", "no expected output"
  std::string detail;
  Comparison cmp;
  Tolerance tol;
  bool has_numbers = false;
};

double inf() {
  return std::numeric_limits<double>::infinity();
}

std::string num(double v) {
  if (v == std::numeric_limits<double>::infinity()) return "inf";
  return fmt::format("{:.3e}", v);
}

nlohmann::json row_json(const Row& r) {
  nlohmann::json j = {{"case", r.case_name}, {"backend", r.backend}, {"output", r.output}};
  if (r.has_numbers) {
    const auto finite_or_null = [](double v) {
      return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
    };
    j["max_abs_err"] = finite_or_null(r.max_abs);
    j["max_rel_err"] = finite_or_null(r.max_rel);
    j["mismatches"] = r.cmp.mismatches;
    j["elements"] = r.cmp.count;
    j["rtol"] = r.tol.rtol;
    j["atol"] = r.tol.atol;
  }
  j["verdict"] = r.verdict == "pass"          ? "pass"
                 : r.verdict == "FAIL"        ? "fail"
                 : r.verdict == "ERROR"       ? "error"
                 : r.verdict == "not offered" ? "not_offered"
                                              : "no_expected";
  if (!r.detail.empty()) j[r.verdict == "ERROR" ? "error" : "detail"] = r.detail;
  return j;
}

void print_table(const std::vector<Row>& rows) {
  const std::vector<std::string> head = {"case",        "backend",     "output",
                                         "max abs err", "max rel err", "verdict"};
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : rows) {
    std::string verdict = r.verdict;
    if (r.verdict == "FAIL") verdict += " " + r.detail;
    cells.push_back({r.case_name, r.backend, r.output, r.has_numbers ? num(r.max_abs) : "-",
                     r.has_numbers ? num(r.max_rel) : "-", verdict});
  }
  std::vector<std::size_t> width(head.size());
  for (std::size_t i = 0; i < head.size(); ++i) width[i] = head[i].size();
  for (const auto& c : cells) {
    for (std::size_t i = 0; i + 1 < c.size(); ++i) width[i] = std::max(width[i], c[i].size());
  }
  const auto line = [&](const std::vector<std::string>& c) {
    std::string s;
    for (std::size_t i = 0; i < c.size(); ++i) {
      const bool numeric = i == 3 || i == 4;
      if (i + 1 == c.size()) {
        s += c[i];
      } else {
        s += numeric ? fmt::format("{:>{}}  ", c[i], width[i])
                     : fmt::format("{:<{}}  ", c[i], width[i]);
      }
    }
    fmt::print("{}\n", s);
  };
  line(head);
  for (const auto& c : cells) line(c);
}

/// How far one profile's reference output is from the expected one.
struct Distance {
  std::string profile;
  double max_abs = 0.0, mean_abs = 0.0;
  std::string error;
};

/// The reference's outputs of `c` under every rounding profile against the
/// expected outputs, and which profile is nearest (SPEC §10.3): by max abs
/// err, ties by mean abs err; equal distances are all named.
void explain(const Case& c, bool json) {
  const std::string& dir = c.spec.name;
  const bool attention = c.spec.op == Op::attention || c.spec.op == Op::attention_backward;
  if (!attention || c.spec.dtype == tandem::DType::f32 || c.expected.empty()) {
    const std::string why = c.spec.dtype == tandem::DType::f32
                                ? "dtype f32: no profile rounds between input and output"
                            : !attention ? std::string(op_info(c.spec.op).name) +
                                               " rounds each output once: profiles do not apply"
                                         : "no expected output to compare with";
    if (json) {
      fmt::print("{}\n",
                 nlohmann::json{{"case", dir}, {"explain", nullptr}, {"detail", why}}.dump());
    } else {
      fmt::print("explain: {}: {} (SPEC section 10.2)\n", dir, why);
    }
    return;
  }
  const Backend ref = tandem::reference::backend();
  std::map<std::string, std::vector<Distance>> by_output;
  for (const tandem::Rounding& r : tandem::kRoundingProfiles) {
    std::map<std::string, std::vector<float>> got;
    std::string error;
    try {
      got = run_case(c, ref, r);
    } catch (const std::exception& e) {
      error = e.what();
    }
    for (const auto& [name, t] : c.expected) {
      Distance d;
      d.profile = std::string(r.name);
      d.error = error;
      if (error.empty()) {
        const auto& g = got.at(name);
        const auto& e = t.array.values;
        d.max_abs = compare(g, e, c.spec.tolerance).max_abs;
        double sum = 0.0;
        for (std::size_t i = 0; i < e.size(); ++i) {
          const double diff = std::fabs(double(g[i]) - double(e[i]));
          sum += std::isnan(diff) ? (std::isnan(g[i]) && std::isnan(e[i]) ? 0.0 : inf()) : diff;
        }
        d.mean_abs = e.empty() ? 0.0 : sum / static_cast<double>(e.size());
      }
      by_output[name].push_back(d);
    }
  }
  for (auto& [name, ds] : by_output) {
    std::vector<Distance> ok;
    for (const auto& d : ds) {
      if (d.error.empty()) ok.push_back(d);
    }
    std::stable_sort(ok.begin(), ok.end(), [](const Distance& a, const Distance& b) {
      return a.max_abs != b.max_abs ? a.max_abs < b.max_abs : a.mean_abs < b.mean_abs;
    });
    std::vector<std::string> nearest;
    for (const auto& d : ok) {
      if (d.max_abs == ok.front().max_abs && d.mean_abs == ok.front().mean_abs) {
        nearest.push_back(d.profile);
      }
    }
    const Distance* next = nullptr;
    for (const auto& d : ok) {
      if (std::find(nearest.begin(), nearest.end(), d.profile) == nearest.end()) {
        next = &d;
        break;
      }
    }
    if (json) {
      nlohmann::json j = {{"case", dir}, {"explain", name}, {"nearest", nearest}};
      for (const auto& d : ds) {
        j["profiles"][d.profile] = d.error.empty() ? nlohmann::json{{"max_abs_err", d.max_abs},
                                                                    {"mean_abs_err", d.mean_abs}}
                                                   : nlohmann::json{{"error", d.error}};
      }
      fmt::print("{}\n", j.dump());
      continue;
    }
    std::string names;
    for (const auto& n : nearest) names += (names.empty() ? "" : " = ") + n;
    std::string line =
        fmt::format("explain: {}: {}: nearest {}", dir, name, names.empty() ? "(none ran)" : names);
    if (!ok.empty()) {
      line += fmt::format(" (max abs err {}, mean {})", num(ok.front().max_abs),
                          num(ok.front().mean_abs));
    }
    if (next != nullptr) {
      line += fmt::format("; next {} (max abs err {}, mean {})", next->profile, num(next->max_abs),
                          num(next->mean_abs));
    }
    for (const auto& d : ds) {
      if (!d.error.empty()) line += fmt::format("; {}: error: {}", d.profile, d.error);
    }
    fmt::print("{}\n", line);
  }
}

int check(const std::vector<std::string>& cases, const std::string& which, bool json,
          bool explain_cases) {
  std::vector<Backend> backends;
  try {
    backends = make_backends(which);
  } catch (const UsageError& e) {
    fmt::print(stderr, "tandem: error: {}\n", e.what());
    return kCannotRun;
  }
  if (which == "all" && !optimized_compiled_in() && !json) {
    fmt::print(stderr,
               "tandem: note: the optimized backend is not compiled in; "
               "checking the reference only\n");
  }
  int status = kPass;
  std::vector<Row> rows;
  const auto emit = [&](Row r) {
    if (json) {
      fmt::print("{}\n", row_json(r).dump());
      std::fflush(stdout);
    }
    rows.push_back(std::move(r));
  };
  const auto error_row = [&](const std::string& case_name, const std::string& backend,
                             const std::string& message) {
    fmt::print(stderr, "tandem: error: {}\n", message);
    Row r;
    r.case_name = case_name;
    r.backend = backend;
    r.output = "-";
    r.verdict = "ERROR";
    r.detail = message;
    emit(std::move(r));
    status = kCannotRun;
  };
  for (const auto& dir : cases) {
    Case c;
    try {
      c = load_case(dir);
    } catch (const CaseError& e) {
      error_row(dir, "-", e.what());
      continue;
    } catch (const std::exception& e) {
      error_row(dir, "-", "case '" + dir + "': " + e.what());
      continue;
    }
    for (const auto& backend : backends) {
      std::map<std::string, std::vector<float>> outputs;
      try {
        outputs = run_case(c, backend);
      } catch (const NotOffered& e) {
        // The reference defines every op and must run it; another backend
        // may leave a low-precision entry point or profile out when all
        // backends are checked (SPEC §9.6); float32 entry points stay required.
        // A backend may leave FlexAttention out as well (SPEC §9.7).
        const bool may_leave_out = c.spec.dtype != tandem::DType::f32 ||
                                   c.spec.kv_cache != tandem::KvCache::plain || is_flex(c.spec.op);
        if (which != "all" || &backend == &backends.front() || !may_leave_out) {
          error_row(dir, backend.name, e.what());
        } else {
          Row r;
          r.case_name = dir;
          r.backend = backend.name;
          r.output = "-";
          r.verdict = "not offered";
          r.detail = e.detail();
          emit(std::move(r));
        }
        continue;
      } catch (const CaseError& e) {
        error_row(dir, backend.name, e.what());
        continue;
      } catch (const std::exception& e) {
        error_row(dir, backend.name,
                  "case '" + dir + "': backend " + backend.name + ": " + e.what());
        continue;
      }
      if (c.expected.empty()) {
        Row r;
        r.case_name = dir;
        r.backend = backend.name;
        r.output = "-";
        r.verdict = "no expected output";
        emit(std::move(r));
        continue;
      }
      for (const auto& name : output_names(c)) {
        auto it = c.expected.find(name);
        if (it == c.expected.end()) continue;
        Row r;
        r.case_name = dir;
        r.backend = backend.name;
        r.output = name;
        r.tol = c.spec.tolerance;
        r.cmp = compare(outputs.at(name), it->second.array.values, c.spec.tolerance);
        r.max_abs = r.cmp.max_abs;
        r.max_rel = r.cmp.max_rel;
        r.has_numbers = true;
        if (r.cmp.pass()) {
          r.verdict = "pass";
        } else {
          r.verdict = "FAIL";
          const auto w = static_cast<std::size_t>(r.cmp.worst);
          r.detail =
              fmt::format("({} of {} elements; worst at {}: got {}, expected {})", r.cmp.mismatches,
                          r.cmp.count, index_string(c.planned.outputs.at(name), r.cmp.worst),
                          outputs.at(name)[w], it->second.array.values[w]);
          status = std::max(status, kMismatch);
        }
        emit(std::move(r));
      }
    }
    if (explain_cases) explain(c, json);
  }
  if (!json) {
    print_table(rows);
    const auto count = [&](const char* v) {
      return std::count_if(rows.begin(), rows.end(), [&](const Row& r) { return r.verdict == v; });
    };
    fmt::print("{} case(s): {} pass, {} fail, {} error(s)", cases.size(), count("pass"),
               count("FAIL"), count("ERROR"));
    const auto skipped = count("not offered");
    if (skipped > 0) fmt::print(", {} not offered", skipped);
    fmt::print("\n");
  }
  return status;
}

int run(const std::string& dir, const std::string& which, const std::string& out_dir) {
  try {
    const auto backends = make_backends(which);
    const Case c = load_case(dir);
    const auto outputs = run_case(c, backends.at(0));
    std::filesystem::create_directories(out_dir);
    for (const auto& [name, values] : outputs) {
      const auto path = (std::filesystem::path(out_dir) / (name + ".npy")).string();
      const tandem::Shape& shape = c.planned.outputs.at(name);
      write_npy(path, shape, values);
      fmt::print("{}: wrote {} {} ({})\n", dir, path, tandem::to_string(shape), which);
    }
    return kPass;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tandem: error: {}\n", e.what());
    return kCannotRun;
  }
}

int run_cli(int argc, char** argv) {
  CLI::App app{"tandem: check the attention-family kernels against case files"};
  app.set_version_flag("--version", std::string(tandem::version));
  app.require_subcommand(1);
  app.footer(help_footer());

  std::vector<std::string> cases;
  std::string check_backend = "all";
  bool json = false;
  auto* check_cmd = app.add_subcommand(
      "check", "Run every case on the chosen backends and compare with its expected outputs");
  check_cmd->add_option("--backend", check_backend, "reference, optimized or all")
      ->check(CLI::IsMember({"reference", "optimized", "all"}))
      ->capture_default_str();
  check_cmd->add_flag("--json", json, "One JSON object per line per case/backend/output");
  bool explain_flag = false;
  check_cmd->add_flag("--explain", explain_flag,
                      "Rerun each bf16/f16 attention case on the reference under every rounding "
                      "profile and name the one nearest to the expected output");
  check_cmd->add_option("CASE", cases, "Case directories")->required();
  check_cmd->footer(help_footer());

  std::string run_case_dir, run_backend = "reference", out_dir;
  auto* run_cmd =
      app.add_subcommand("run", "Run one case on one backend and write its outputs as .npy");
  run_cmd->add_option("CASE", run_case_dir, "Case directory")->required();
  run_cmd->add_option("--backend", run_backend, "reference or optimized")
      ->check(CLI::IsMember({"reference", "optimized"}))
      ->capture_default_str();
  run_cmd->add_option("--out", out_dir, "Directory for <output>.npy files")->required();

#ifdef TANDEM_TOOL_HAVE_OPTIMIZED
  tandem::tool::TuneArgs tune_args;
  auto* tune_cmd = app.add_subcommand(
      "tune", "Tune the optimized attention's bit-neutral geometry on this CPU (SPEC §11)");
  tune_cmd->add_option("--seconds", tune_args.seconds, "Time budget of the whole search")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto* out_opt = tune_cmd->add_option("--out", tune_args.out, "Tuning file to write (JSON)");
  tune_cmd
      ->add_option("--compare", tune_args.compare,
                   "Time this tuning file against the default geometry instead of tuning")
      ->excludes(out_opt);
  tune_cmd->add_option("--threads", tune_args.threads, "Threads per call, 0 = all cores")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  tune_cmd->add_flag("--tiny", tune_args.tiny, "A few small shapes instead of the report's");
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kCannotRun;
  }
  try {
    if (check_cmd->parsed()) return check(cases, check_backend, json, explain_flag);
    if (run_cmd->parsed()) return run(run_case_dir, run_backend, out_dir);
#ifdef TANDEM_TOOL_HAVE_OPTIMIZED
    if (tune_cmd->parsed()) {
      if (!tune_args.compare.empty()) return tandem::tool::compare(tune_args);
      if (tune_args.out.empty()) {
        fmt::print(stderr, "tandem: error: tune needs --out FILE (or --compare FILE)\n");
        return kCannotRun;
      }
      return tandem::tool::tune(tune_args);
    }
#endif
  } catch (const std::exception& e) {
    fmt::print(stderr, "tandem: error: {}\n", e.what());
    return kCannotRun;
  }
  return kCannotRun;
}

}  // namespace

int main(int argc, char** argv) {
  // Setting up the command line can itself throw (std::bad_alloc): exit 2, never abort.
  try {
    return run_cli(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return kCannotRun;
  }
}
