// SPDX-License-Identifier: Apache-2.0
// Tuned geometries (tuning.hpp, SPEC §11): shape classes, the CPU's
// identity, the bit-neutral fields and their search space, and the tuning
// file (JSON) with its checks.
#include "tandem/optimized/tuning.hpp"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tandem/error.hpp"
#include "tandem/optimized/backend.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tandem::optimized {
namespace {

using nlohmann::json;

/// Rows of one SIMD vector at most (AVX-512 floats): calls of at most this
/// many query rows per kv head are decode steps.
constexpr std::int64_t kDecodeRows = 16;
constexpr int kFormat = 1;

/// Throws Error naming the file and the field.
[[noreturn]] void malformed(const std::string& path, const std::string& field,
                            const std::string& what) {
  throw Error("tuning", "tuning file " + path + ": " + field + " " + what);
}

/// The member `key` of object `o` (at `where`), required.
const json& member(const json& o, const std::string& key, const std::string& where,
                   const std::string& path) {
  if (!o.is_object() || !o.contains(key)) malformed(path, where + key, "is missing");
  return o.at(key);
}

std::string string_of(const json& o, const std::string& key, const std::string& where,
                      const std::string& path) {
  const json& v = member(o, key, where, path);
  if (!v.is_string()) malformed(path, where + key, "must be a string");
  return v.get<std::string>();
}

std::int64_t int_of(const json& o, const std::string& key, const std::string& where,
                    const std::string& path) {
  const json& v = member(o, key, where, path);
  if (!v.is_number_integer()) malformed(path, where + key, "must be an integer");
  return v.get<std::int64_t>();
}

ShapeKind kind_of(const std::string& name, const std::string& where, const std::string& path) {
  for (ShapeKind k : {ShapeKind::prefill, ShapeKind::decode, ShapeKind::backward}) {
    if (to_string(k) == name) return k;
  }
  malformed(path, where, "= \"" + name + "\" must be prefill, decode or backward");
}

/// One entry of "classes": kind, D and the tuned fields, each in its space.
TunedClass class_of(const json& c, const std::string& where, const std::string& path) {
  TunedClass t;
  t.cls.kind = kind_of(string_of(c, "kind", where, path), where + "kind", path);
  t.cls.D = int_of(c, "D", where, path);
  if (t.cls.D < 1) malformed(path, where + "D", "must be >= 1");
  for (const auto& [key, value] : c.items()) {
    if (key == "kind" || key == "D") continue;
    if (key != "rows_per_tile") {
      malformed(path, where + key, "is not a bit-neutral field of the tuning (only rows_per_tile)");
    }
    const std::int64_t rows = int_of(c, key, where, path);
    const std::vector<std::int64_t> space = tuning_space(t.cls.kind).rows_per_tile;
    if (std::find(space.begin(), space.end(), rows) == space.end()) {
      malformed(path, where + key,
                "= " + std::to_string(rows) + " is outside the tuning space of " +
                    to_string(t.cls.kind) + " calls");
    }
    t.fields.rows_per_tile = rows;
  }
  return t;
}

}  // namespace

std::string to_string(ShapeKind kind) {
  switch (kind) {
    case ShapeKind::prefill:
      return "prefill";
    case ShapeKind::decode:
      return "decode";
    case ShapeKind::backward:
      return "backward";
  }
  return "?";
}

ShapeClass shape_class(const AttentionPlan& plan, bool backward) {
  if (backward) return {ShapeKind::backward, plan.D};
  const bool decode = plan.Sq <= kDecodeRows / std::max<std::int64_t>(1, plan.group());
  return {decode ? ShapeKind::decode : ShapeKind::prefill, plan.D};
}

CpuIdentity current_cpu() {
  CpuIdentity c;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, cc = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &cc, &d)) {
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &cc, 4);
    c.vendor = vendor;
  }
  if (__get_cpuid(1, &a, &b, &cc, &d)) {
    const unsigned base_family = (a >> 8) & 0xF, ext_family = (a >> 20) & 0xFF;
    const unsigned base_model = (a >> 4) & 0xF, ext_model = (a >> 16) & 0xF;
    c.family = base_family == 0xF ? base_family + ext_family : base_family;
    c.model = base_family == 0x6 || base_family == 0xF ? (ext_model << 4) | base_model : base_model;
  }
  unsigned top = __get_cpuid_max(0x80000000u, nullptr);
  if (top >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      unsigned r[4] = {};
      __get_cpuid(0x80000002u + i, &r[0], &r[1], &r[2], &r[3]);
      std::memcpy(brand + std::size_t{16} * i, r, 16);
    }
    std::string s = brand;
    const auto first = s.find_first_not_of(' '), last = s.find_last_not_of(' ');
    c.brand = first == std::string::npos ? "" : s.substr(first, last - first + 1);
  }
#endif
  force_environment_target();   // as backend() would, before it reads the target
  c.target = current_target();  // the best, unless TANDEM_TARGET or force_target chose one
  return c;
}

std::string to_string(const CpuIdentity& cpu) {
  std::ostringstream os;
  os << cpu.vendor << " family " << cpu.family << " model " << cpu.model << " (" << cpu.brand
     << "), " << cpu.target;
  return os.str();
}

Geometry apply(const TunedFields& t, Geometry base) {
  if (t.rows_per_tile) base.rows_per_tile = *t.rows_per_tile;
  return base;
}

TuningSpace tuning_space(ShapeKind kind) {
  TuningSpace s;
  if (kind == ShapeKind::prefill) {
    s.rows_per_tile = {64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024};
  }
  return s;
}

const TunedFields* Tuning::find(const ShapeClass& cls) const {
  for (const TunedClass& c : classes) {
    if (c.cls == cls) return &c.fields;
  }
  return nullptr;
}

Geometry Tuning::geometry(const ShapeClass& cls, const Geometry& base) const {
  const TunedFields* f = find(cls);
  return f != nullptr ? apply(*f, base) : base;
}

std::string to_json(const Tuning& t) {
  json j;
  j["format"] = kFormat;
  j["cpu"] = {{"vendor", t.cpu.vendor},
              {"family", t.cpu.family},
              {"model", t.cpu.model},
              {"brand", t.cpu.brand},
              {"target", t.cpu.target}};
  j["classes"] = json::array();
  for (const TunedClass& c : t.classes) {
    json e = {{"kind", to_string(c.cls.kind)}, {"D", c.cls.D}};
    if (c.fields.rows_per_tile) e["rows_per_tile"] = *c.fields.rows_per_tile;
    j["classes"].push_back(e);
  }
  return j.dump(2) + "\n";
}

void save_tuning(const Tuning& t, const std::string& path) {
  std::ofstream f(path);
  f << to_json(t);
  f.close();
  if (!f) throw Error("tuning", "tuning file " + path + ": cannot be written");
}

Tuning parse_tuning(const std::string& text, const std::string& path) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) malformed(path, "the file", "is not JSON");
  if (!j.is_object()) malformed(path, "the file", "must be a JSON object");
  const std::int64_t format = int_of(j, "format", "", path);
  if (format != kFormat) {
    malformed(path, "format",
              "= " + std::to_string(format) + " must be " + std::to_string(kFormat));
  }
  Tuning t;
  const json& cpu = member(j, "cpu", "", path);
  t.cpu.vendor = string_of(cpu, "vendor", "cpu.", path);
  t.cpu.brand = string_of(cpu, "brand", "cpu.", path);
  t.cpu.target = string_of(cpu, "target", "cpu.", path);
  t.cpu.family = int_of(cpu, "family", "cpu.", path);
  t.cpu.model = int_of(cpu, "model", "cpu.", path);
  const json& classes = member(j, "classes", "", path);
  if (!classes.is_array()) malformed(path, "classes", "must be an array");
  for (std::size_t i = 0; i < classes.size(); ++i) {
    const std::string where = "classes[" + std::to_string(i) + "].";
    TunedClass c = class_of(classes[i], where, path);
    if (t.find(c.cls) != nullptr) malformed(path, where + "kind", "repeats an earlier class");
    t.classes.push_back(c);
  }
  return t;
}

std::optional<Tuning> load_tuning(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error("tuning", "tuning file " + path + ": cannot be read");
  std::ostringstream text;
  text << f.rdbuf();
  Tuning t = parse_tuning(text.str(), path);
  const CpuIdentity here = current_cpu();
  if (!(t.cpu == here)) {
    std::cerr << "tandem: tuning file " << path << " was made on " << to_string(t.cpu)
              << ", not this CPU (" << to_string(here) << "): ignored, default geometry used\n";
    return std::nullopt;
  }
  return t;
}

std::shared_ptr<const Tuning> environment_tuning() {
  static std::once_flag once;
  static std::shared_ptr<const Tuning> tuning;
  std::call_once(once, [] {
    const char* path = std::getenv("TANDEM_TUNING");
    if (path == nullptr || *path == '\0') return;
    if (std::optional<Tuning> t = load_tuning(path)) {
      tuning = std::make_shared<const Tuning>(std::move(*t));
    }
  });
  return tuning;
}

}  // namespace tandem::optimized
