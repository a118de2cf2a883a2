// SPDX-License-Identifier: Apache-2.0
// Case files: case.json → typed attrs → plan (through the library's
// from_shapes only) → backend call → comparison.
#include "case.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace tandem::tool {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kCaseJson = "case.json";

std::string compose(const std::string& c, const std::string& file, const std::string& field,
                    const std::string& detail) {
  std::string s = "case '" + c + "': " + file;
  if (!field.empty()) s += ": " + field;
  return s + ": " + detail;
}

/// How a JSON value is described in messages: its type and a short dump.
std::string describe_json(const json& v) {
  std::string dump = v.dump();
  if (dump.size() > 40) dump = dump.substr(0, 37) + "...";
  const char* type = v.is_string()            ? "a string"
                     : v.is_boolean()         ? "a boolean"
                     : v.is_number_integer()  ? "an integer"
                     : v.is_number_unsigned() ? "an integer"
                     : v.is_number_float()    ? "a number"
                     : v.is_object()          ? "an object"
                     : v.is_array()           ? "an array"
                     : v.is_null()            ? "null"
                                              : "a value";
  return dump + " (" + type + ")";
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s.empty() ? "(none)" : s;
}

/// Reads typed values out of case.json, throwing CaseErrors that name the field.
class JsonReader {
 public:
  explicit JsonReader(std::string case_name) : case_(std::move(case_name)) {}

  [[noreturn]] void error(const std::string& field, const std::string& detail) const {
    throw CaseError(case_, kCaseJson, field, detail);
  }

  std::int64_t integer(const json& v, const std::string& field) const {
    if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return static_cast<std::int64_t>(u);
      }
      error(field, "= " + describe_json(v) + " does not fit a 64-bit signed integer");
    }
    error(field, "must be an integer, got " + describe_json(v));
  }

  double number(const json& v, const std::string& field) const {
    if (!v.is_number()) error(field, "must be a number, got " + describe_json(v));
    const double d = v.get<double>();
    if (!std::isfinite(d)) error(field, "= " + describe_json(v) + " must be finite");
    return d;
  }

  bool boolean(const json& v, const std::string& field) const {
    if (!v.is_boolean()) error(field, "must be true or false, got " + describe_json(v));
    return v.get<bool>();
  }

  template <class E>
  E choice(const json& v, const std::string& field,
           const std::vector<std::pair<const char*, E>>& options) const {
    std::vector<std::string> names;
    names.reserve(options.size());
    for (const auto& [name, value] : options) names.emplace_back(std::string("\"") + name + "\"");
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      for (const auto& [name, value] : options) {
        if (s == name) return value;
      }
    }
    error(field, "must be one of " + join(names) + ", got " + describe_json(v));
  }

  const json& object(const json& v, const std::string& field) const {
    if (!v.is_object()) error(field, "must be a JSON object, got " + describe_json(v));
    return v;
  }

 private:
  std::string case_;
};

/// Parses JSON, rejecting duplicate keys (which the JSON library would
/// otherwise silently resolve to the last one).
json parse_json_strict(std::string_view text, const JsonReader& r) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    r.error("", std::string("is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) r.error(duplicate, "key appears more than once");
  return j;
}

/// The optional attention inputs that switch a feature on (spec §2.7–2.10),
/// with the field of AttentionShapes that holds each one's shape.
const std::array<std::pair<const char*, std::optional<Shape> AttentionShapes::*>, 8>
    kFeatureShapes = {{{"sinks", &AttentionShapes::sinks},
                       {"alibi_slopes", &AttentionShapes::alibi_slopes},
                       {"cu_seqlens_q", &AttentionShapes::cu_seqlens_q},
                       {"cu_seqlens_k", &AttentionShapes::cu_seqlens_k},
                       {"seqused_k", &AttentionShapes::seqused_k},
                       {"block_table", &AttentionShapes::block_table},
                       {"cache_seqlens", &AttentionShapes::cache_seqlens},
                       {"key_origin", &AttentionShapes::key_origin}}};

/// The index inputs of attention (read as integers), with their AttentionInputs field.
const std::array<std::pair<const char*, Indices AttentionInputs<float>::*>, 6> kIndexInputs = {
    {{"cu_seqlens_q", &AttentionInputs<float>::cu_seqlens_q},
     {"cu_seqlens_k", &AttentionInputs<float>::cu_seqlens_k},
     {"seqused_k", &AttentionInputs<float>::seqused_k},
     {"block_table", &AttentionInputs<float>::block_table},
     {"cache_seqlens", &AttentionInputs<float>::cache_seqlens},
     {"key_origin", &AttentionInputs<float>::key_origin}}};

/// "attrs.<name>" for messages.
std::string attr_field(const std::string& name) {
  return "attrs." + name;
}

/// The case's storage type and rounding profile (SPEC §9.1, §10.3).
void parse_storage(const json& j, const OpInfo& info, const JsonReader& r, CaseSpec& spec) {
  if (j.contains("dtype")) {
    spec.dtype = r.choice<DType>(j.at("dtype"), "dtype",
                                 {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f16", DType::f16}});
  }
  if (j.contains("rounding")) {
    const json& v = j.at("rounding");
    const auto profile = v.is_string() ? rounding_profile(v.get<std::string>()) : std::nullopt;
    if (!profile) {
      r.error("rounding",
              "must be one of " + rounding_profile_names() + ", got " + describe_json(v));
    }
    if (info.op != Op::attention && info.op != Op::attention_backward) {
      r.error("rounding", std::string("applies to attention only: ") + info.name +
                              " rounds each output once (SPEC §10.2)");
    }
    spec.rounding = *profile;
    spec.rounding_given = true;
  }
}

/// The value of a real constant: a JSON number, or "inf" / "-inf" (JSON has
/// no infinity; `where(c, score, -inf)` hides a key).
double constant_value(const json& v, const std::string& field, const JsonReader& r) {
  if (v.is_string() && (v == "inf" || v == "-inf")) {
    return v == "inf" ? std::numeric_limits<double>::infinity()
                      : -std::numeric_limits<double>::infinity();
  }
  if (!v.is_number())
    r.error(field, "must be a number, \"inf\" or \"-inf\", got " + describe_json(v));
  return v.get<double>();
}

/// The integers of a JSON array.
std::vector<std::int64_t> integer_list(const json& v, const std::string& field,
                                       const JsonReader& r) {
  if (!v.is_array()) r.error(field, "must be an array of integers, got " + describe_json(v));
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    out.push_back(r.integer(v[i], field + "[" + std::to_string(i) + "]"));
  }
  return out;
}

/// A captured tensor `[name, shape, type, lo, hi]` of a node list.
ModTensor mod_tensor(const json& t, const std::string& field, const JsonReader& r) {
  if (!t.is_array() || t.size() != 5) {
    r.error(field, "must be [name, shape, type, lo, hi], got " + describe_json(t));
  }
  if (!t[0].is_string() || t[0].get<std::string>().empty()) {
    r.error(field + "[0]",
            "the tensor's name must be a non-empty string, got " + describe_json(t[0]));
  }
  ModTensor m;
  m.name = t[0].get<std::string>();
  m.shape = integer_list(t[1], field + "[1]", r);
  m.type = r.choice<ModType>(t[2], field + "[2]",
                             {{"real", ModType::real}, {"integer", ModType::integer}});
  m.lo = r.integer(t[3], field + "[3]");
  m.hi = r.integer(t[4], field + "[4]");
  return m;
}

/// The operation a node list names: to_string(ModOp) of §13.1.
ModOp mod_op_named(const json& v, const std::string& field, const JsonReader& r) {
  std::vector<std::string> names;
  for (int i = 0; i <= static_cast<int>(ModOp::where); ++i) {
    names.emplace_back(to_string(static_cast<ModOp>(i)));
    if (v == names.back()) return static_cast<ModOp>(i);
  }
  names.emplace_back("as_real");
  r.error(field, "unknown op " + describe_json(v) + "; known: " + join(names));
}

/// The fields of a leaf, constant or load node: type, value, ivalue, tensor
/// and its index nodes (`operand` maps a position to the program's node).
template <class Operand>
ModNode mod_leaf(const json& n, const std::string& field, const JsonReader& r,
                 const Operand& operand) {
  ModNode m;
  m.type = r.choice<ModType>(
      n[2], field + "[2]",
      {{"real", ModType::real}, {"integer", ModType::integer}, {"boolean", ModType::boolean}});
  m.value = constant_value(n[3], field + "[3]", r);
  m.ivalue = r.integer(n[4], field + "[4]");
  m.tensor = static_cast<std::int32_t>(std::clamp<std::int64_t>(
      r.integer(n[5], field + "[5]"), -1, std::numeric_limits<std::int32_t>::max()));
  const auto index = integer_list(n[6], field + "[6]", r);
  if (index.size() > static_cast<std::size_t>(kModMaxRank)) {
    r.error(field + "[6]", "a tensor has rank 1 to 4: at most 4 indices");
  }
  for (std::size_t i = 0; i < index.size(); ++i) {
    m.index[i] = operand(index[i], field + "[6][" + std::to_string(i) + "]");
  }
  return m;
}

/// One node `[op, args, type, value, ivalue, tensor, index]` added to `p`
/// (operands by their position in the list, `id` maps them to p's nodes);
/// `as_real` is a cast to real, to_real unless the operand is real.
void mod_node(const json& n, const std::string& field, const JsonReader& r, ModProgram& p,
              std::vector<std::int32_t>& id) {
  if (!n.is_array() || n.size() != 7) {
    r.error(field,
            "must be [op, args, type, value, ivalue, tensor, index], got " + describe_json(n));
  }
  const auto operand = [&](std::int64_t at, const std::string& f) -> std::int32_t {
    if (at < 0 || at >= static_cast<std::int64_t>(id.size())) {
      r.error(f, "= " + std::to_string(at) + " must name an earlier node (0…" +
                     std::to_string(static_cast<std::int64_t>(id.size()) - 1) + ")");
    }
    return id[static_cast<std::size_t>(at)];
  };
  if (!n[0].is_string())
    r.error(field + "[0]", "the op must be a string, got " + describe_json(n[0]));
  const std::string op_name = n[0].get<std::string>();
  const auto args = integer_list(n[1], field + "[1]", r);
  if (args.size() > 3) r.error(field + "[1]", "an operation takes at most 3 operands");
  std::array<std::int32_t, 3> a{-1, -1, -1};
  for (std::size_t i = 0; i < args.size(); ++i) {
    a[i] = operand(args[i], field + "[1][" + std::to_string(i) + "]");
  }
  try {
    if (op_name == "as_real") {
      if (args.size() != 1) r.error(field + "[1]", "as_real takes one operand");
      id.push_back(p.node(a[0]).type == ModType::real ? a[0] : p.apply(ModOp::to_real, a[0]).id);
      return;
    }
    const ModOp op = mod_op_named(n[0], field + "[0]", r);
    if (op > ModOp::load) {
      id.push_back(p.apply(op, ModValue{&p, a[0]}, ModValue{&p, a[1]}, ModValue{&p, a[2]}).id);
      return;
    }
    ModNode m = mod_leaf(n, field, r, operand);
    m.op = op;
    m.arg = a;
    id.push_back(p.add(m));
  } catch (const Error& e) {
    r.error(field, e.what());
  }
}

/// A program from its node list (SPEC §9.7): `{"name", "tensors", "nodes",
/// "result"}`, the object tandem.flex's tracer records.
ModProgram mod_program(const json& v, const std::string& field, const JsonReader& r) {
  r.object(v, field);
  for (const auto& [key, value] : v.items()) {
    if (key != "name" && key != "tensors" && key != "nodes" && key != "result") {
      r.error(field + "." + key, "unknown key (expected name, tensors, nodes, result)");
    }
  }
  if (v.contains("name") && !v.at("name").is_string()) {
    r.error(field + ".name", "must be a string, got " + describe_json(v.at("name")));
  }
  for (const char* key : {"tensors", "nodes", "result"}) {
    if (!v.contains(key)) r.error(field + "." + key, "is missing");
  }
  ModProgram p;
  const json& tensors = v.at("tensors");
  if (!tensors.is_array())
    r.error(field + ".tensors", "must be an array, got " + describe_json(tensors));
  std::set<std::string> names;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string f = field + ".tensors[" + std::to_string(i) + "]";
    ModTensor t = mod_tensor(tensors[i], f, r);
    if (!names.insert(t.name).second) r.error(f + "[0]", "tensor " + t.name + " is captured twice");
    try {
      p.capture(std::move(t));
    } catch (const Error& e) {
      r.error(f, e.what());
    }
  }
  const json& nodes = v.at("nodes");
  if (!nodes.is_array() || nodes.empty()) {
    r.error(field + ".nodes", "must be a non-empty array of nodes, got " + describe_json(nodes));
  }
  std::vector<std::int32_t> id;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    mod_node(nodes[i], field + ".nodes[" + std::to_string(i) + "]", r, p, id);
  }
  const std::int64_t result = r.integer(v.at("result"), field + ".result");
  if (result < 0 || result >= static_cast<std::int64_t>(id.size())) {
    r.error(field + ".result", "= " + std::to_string(result) + " must name a node (0…" +
                                   std::to_string(static_cast<std::int64_t>(id.size()) - 1) + ")");
  }
  p.set_result(id[static_cast<std::size_t>(result)]);
  return p;
}

/// The attrs of the flex ops: the two programs, the scale and the block size
/// (an integer for both axes, or [q_block, kv_block], as torch's BLOCK_SIZE).
void parse_flex_attrs(const json& attrs, const JsonReader& r, FlexAttrs& f) {
  if (attrs.contains("score_mod")) {
    f.score_mod = mod_program(attrs.at("score_mod"), "attrs.score_mod", r);
  }
  if (attrs.contains("mask_mod")) {
    f.mask_mod = mod_program(attrs.at("mask_mod"), "attrs.mask_mod", r);
  }
  if (attrs.contains("scale")) f.scale = r.number(attrs.at("scale"), "attrs.scale");
  if (attrs.contains("block_size")) {
    const json& b = attrs.at("block_size");
    if (b.is_array()) {
      const auto sizes = integer_list(b, "attrs.block_size", r);
      if (sizes.size() != 2) {
        r.error("attrs.block_size",
                "must be an integer or [q_block, kv_block], got " + describe_json(b));
      }
      f.q_block = sizes[0];
      f.kv_block = sizes[1];
    } else {
      f.q_block = f.kv_block = r.integer(b, "attrs.block_size");
    }
  }
  // A tensor both mods capture is one input: the two must describe it alike.
  for (const auto& s : f.score_mod.tensors()) {
    for (const auto& m : f.mask_mod.tensors()) {
      if (s.name == m.name && (s.shape != m.shape || s.type != m.type)) {
        r.error("attrs.mask_mod.tensors",
                "tensor " + m.name + " is also the score_mod's, with another shape or type");
      }
    }
  }
}

/// The tensors the mods capture, each name once (the score_mod's first).
std::vector<const ModTensor*> flex_tensors(const FlexAttrs& f);

/// Every captured tensor is an input of its own name (not one of the op's),
/// and the block mask's inputs come as a partial pair and an optional full pair.
void check_flex_inputs(const CaseSpec& spec, const OpInfo& info, const JsonReader& r) {
  for (const auto* p : {&spec.flex.score_mod, &spec.flex.mask_mod}) {
    const std::string field = p == &spec.flex.score_mod ? "attrs.score_mod" : "attrs.mask_mod";
    for (const auto& t : p->tensors()) {
      const auto& req = info.required_inputs;
      const auto& opt = info.optional_inputs;
      if (std::find(req.begin(), req.end(), t.name) != req.end() ||
          std::find(opt.begin(), opt.end(), t.name) != opt.end()) {
        r.error(field + ".tensors", "tensor " + t.name + " has the name of an input of " +
                                        info.name + ": name it otherwise");
      }
      if (!spec.inputs.count(t.name)) {
        r.error("inputs." + t.name,
                "missing input (the " + field.substr(6) + " captures tensor " + t.name + ")");
      }
    }
  }
  const auto has = [&](const char* n) { return spec.inputs.count(n) != 0; };
  if (has("kv_num_blocks") != has("kv_indices")) {
    r.error(has("kv_indices") ? "inputs.kv_num_blocks" : "inputs.kv_indices",
            "missing input: a block mask is kv_num_blocks and kv_indices (and optionally "
            "full_kv_num_blocks and full_kv_indices)");
  }
  if (has("full_kv_num_blocks") != has("full_kv_indices")) {
    r.error(has("full_kv_indices") ? "inputs.full_kv_num_blocks" : "inputs.full_kv_indices",
            "missing input: full blocks are full_kv_num_blocks and full_kv_indices together");
  }
  if (has("full_kv_num_blocks") && !has("kv_num_blocks")) {
    r.error("inputs.kv_num_blocks",
            "missing input: full blocks need the partial ones (kv_num_blocks, kv_indices)");
  }
  if (spec.attrs_given.count("block_size") && !has("kv_num_blocks")) {
    r.error("attrs.block_size", "is given without a block mask (inputs kv_num_blocks, kv_indices)");
  }
}

std::vector<const ModTensor*> flex_tensors(const FlexAttrs& f) {
  std::vector<const ModTensor*> out;
  for (const auto* p : {&f.score_mod, &f.mask_mod}) {
    for (const auto& t : p->tensors()) {
      if (std::none_of(out.begin(), out.end(),
                       [&](const ModTensor* o) { return o->name == t.name; })) {
        out.push_back(&t);
      }
    }
  }
  return out;
}

}  // namespace

CaseError::CaseError(std::string case_name, std::string file, std::string field, std::string detail)
    : std::runtime_error(compose(case_name, file, field, detail)),
      case_(std::move(case_name)),
      file_(std::move(file)),
      field_(std::move(field)),
      detail_(std::move(detail)) {}

const std::vector<OpInfo>& op_table() {
  static const std::vector<std::string> rope_attrs = {"head_dim", "num_heads", "layout",
                                                      "n_rot",    "style",     "table_rows"};
  static const std::vector<OpInfo> table = {
      {Op::attention,
       "attention",
       {"q", "k", "v"},
       {"mask", "sinks", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table",
        "cache_seqlens", "key_origin", "k_scale", "v_scale"},
       {"out"},
       {"num_heads", "layout", "mask", "window", "scale", "softcap", "kv_cache"},
       {2e-4, 2e-5}},
      {Op::attention_backward,
       "attention_backward",
       {"q", "k", "v", "dout"},
       {"mask", "sinks", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table",
        "cache_seqlens", "key_origin"},
       {"dq", "dk", "dv", "dsinks", "dbias"},
       {"num_heads", "layout", "mask", "window", "scale", "softcap"},
       {1e-3, 1e-4}},
      {Op::rope, "rope", {"x", "cos", "sin"}, {"positions"}, {"out"}, rope_attrs, {1e-5, 1e-6}},
      {Op::rope_backward,
       "rope_backward",
       {"dout", "cos", "sin"},
       {"positions"},
       {"dx"},
       rope_attrs,
       {1e-5, 1e-6}},
      {Op::rope_qk,
       "rope_qk",
       {"q", "k", "cos", "sin"},
       {"positions"},
       {"q_out", "k_out"},
       rope_attrs,
       {1e-5, 1e-6}},
      {Op::rope_qk_backward,
       "rope_qk_backward",
       {"dq_out", "dk_out", "cos", "sin"},
       {"positions"},
       {"dq", "dk"},
       rope_attrs,
       {1e-5, 1e-6}},
      {Op::axial_rope,
       "axial_rope",
       {"x"},
       {},
       {"out"},
       {"num_heads", "end_x", "end_y", "theta", "repeat_factor"},
       {1e-4, 1e-5}},
      {Op::axial_rope_backward,
       "axial_rope_backward",
       {"dout"},
       {},
       {"dx"},
       {"num_heads", "end_x", "end_y", "theta", "repeat_factor"},
       {1e-4, 1e-5}},
      {Op::swiglu, "swiglu", {"x"}, {}, {"out"}, {"gate_first"}, {1e-5, 1e-6}},
      {Op::swiglu_backward,
       "swiglu_backward",
       {"x", "dout"},
       {},
       {"dx"},
       {"gate_first"},
       {1e-4, 1e-5}},
      {Op::attention_block,
       "attention_block",
       {"x", "w_qkv", "w_out"},
       {"b_qkv", "b_out", "mask", "cos", "sin"},
       {"out"},
       {"num_heads"},
       {1e-3, 1e-4}},
      // The captured tensors of the mods are inputs too, named by the node
      // lists; the backward's gradients of them are outputs d<name> (SPEC §9.7).
      {Op::flex_attention,
       "flex_attention",
       {"q", "k", "v"},
       {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"},
       {"out", "lse"},
       {"score_mod", "mask_mod", "scale", "block_size"},
       {2e-4, 2e-5}},
      {Op::flex_attention_backward,
       "flex_attention_backward",
       {"q", "k", "v", "dout"},
       {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"},
       {"dq", "dk", "dv"},
       {"score_mod", "mask_mod", "scale", "block_size"},
       {1e-3, 1e-4}},
  };
  return table;
}

bool is_flex(Op op) {
  return op == Op::flex_attention || op == Op::flex_attention_backward;
}

bool is_index_input(const std::string& name) {
  return name == "positions" || std::any_of(kIndexInputs.begin(), kIndexInputs.end(),
                                            [&](const auto& entry) { return name == entry.first; });
}

const OpInfo& op_info(Op op) {
  for (const auto& info : op_table()) {
    if (info.op == op) return info;
  }
  throw std::logic_error("op_info: unknown op");
}

// ---- case.json ---------------------------------------------------------------

CaseSpec parse_case_json(std::string_view text, const std::string& case_name) {
  const JsonReader r(case_name);
  const json j = parse_json_strict(text, r);
  r.object(j, "(top level)");
  for (const auto& [key, value] : j.items()) {
    if (key != "op" && key != "attrs" && key != "inputs" && key != "expected" &&
        key != "tolerance" && key != "dtype" && key != "rounding") {
      r.error(key,
              "unknown key (expected op, attrs, inputs, expected, tolerance, dtype, rounding)");
    }
  }
  CaseSpec spec;
  spec.name = case_name;

  // op
  if (!j.contains("op")) r.error("op", "is missing");
  const json& op = j.at("op");
  if (!op.is_string()) r.error("op", "must be a string, got " + describe_json(op));
  const std::string op_name = op.get<std::string>();
  const OpInfo* info = nullptr;
  std::vector<std::string> op_names;
  for (const auto& o : op_table()) {
    op_names.emplace_back(o.name);
    if (op_name == o.name) info = &o;
  }
  if (!info) r.error("op", "unknown op " + describe_json(op) + "; known: " + join(op_names));
  spec.op = info->op;
  spec.tolerance = info->tolerance;
  parse_storage(j, *info, r, spec);

  // attrs
  const json empty = json::object();
  const json& attrs = j.contains("attrs") ? r.object(j.at("attrs"), "attrs") : empty;
  for (const auto& [key, value] : attrs.items()) {
    if (std::find(info->attrs.begin(), info->attrs.end(), key) == info->attrs.end()) {
      r.error(attr_field(key), std::string("unknown attr for op ") + info->name +
                                   " (its attrs: " + join(info->attrs) + ")");
    }
    spec.attrs_given.insert(key);
  }
  const auto has = [&](const char* k) { return attrs.contains(k); };
  const auto integer = [&](const char* k) { return r.integer(attrs.at(k), attr_field(k)); };
  const auto number = [&](const char* k) { return r.number(attrs.at(k), attr_field(k)); };
  const auto required = [&](const char* k) {
    if (!has(k)) r.error(attr_field(k), std::string("is required for op ") + info->name);
  };
  switch (spec.op) {
    case Op::attention:
    case Op::attention_backward: {
      AttentionAttrs& a = spec.attention;
      required("num_heads");
      a.num_heads = integer("num_heads");
      if (has("layout")) {
        a.layout = r.choice<QkvLayout>(
            attrs.at("layout"), attr_field("layout"),
            {{"bshd", QkvLayout::bshd}, {"bhsd", QkvLayout::bhsd}, {"thd", QkvLayout::thd}});
      }
      if (has("mask")) {
        a.mask = r.choice<MaskKind>(attrs.at("mask"), attr_field("mask"),
                                    {{"none", MaskKind::none},
                                     {"causal", MaskKind::causal},
                                     {"sliding_window", MaskKind::sliding_window},
                                     {"key_padding", MaskKind::key_padding},
                                     {"bias", MaskKind::bias}});
      }
      if (has("window")) a.window = integer("window");
      if (has("scale")) a.scale = number("scale");
      if (has("softcap")) a.softcap = number("softcap");
      if (has("kv_cache")) {
        spec.kv_cache = r.choice<KvCache>(
            attrs.at("kv_cache"), attr_field("kv_cache"),
            {{"plain", KvCache::plain}, {"int8", KvCache::int8}, {"e4m3", KvCache::e4m3}});
      }
      break;
    }
    case Op::rope:
    case Op::rope_backward:
    case Op::rope_qk:
    case Op::rope_qk_backward: {
      RopeAttrs& a = spec.rope;
      if (has("head_dim")) a.head_dim = integer("head_dim");
      if (has("num_heads")) a.num_heads = integer("num_heads");
      if (has("layout")) {
        a.layout = r.choice<RopeLayout>(
            attrs.at("layout"), attr_field("layout"),
            {{"bshd", RopeLayout::bshd}, {"bhsd", RopeLayout::bhsd}, {"thd", RopeLayout::thd}});
      }
      if (has("n_rot")) a.n_rot = integer("n_rot");
      if (has("style")) {
        a.style = r.choice<RopeStyle>(attrs.at("style"), attr_field("style"),
                                      {{"neox", RopeStyle::neox}, {"gptj", RopeStyle::gptj}});
      }
      if (has("table_rows")) {
        a.table_rows = r.choice<TableRows>(attrs.at("table_rows"), attr_field("table_rows"),
                                           {{"position", TableRows::position},
                                            {"token", TableRows::token},
                                            {"position_ids", TableRows::position_ids}});
      }
      break;
    }
    case Op::axial_rope:
    case Op::axial_rope_backward: {
      AxialRopeAttrs& a = spec.axial;
      if (has("num_heads")) a.num_heads = integer("num_heads");
      required("end_x");
      required("end_y");
      a.end_x = integer("end_x");
      a.end_y = integer("end_y");
      if (has("theta")) a.theta = number("theta");
      if (has("repeat_factor")) a.repeat_factor = integer("repeat_factor");
      break;
    }
    case Op::swiglu:
    case Op::swiglu_backward:
      if (has("gate_first"))
        spec.gate_first = r.boolean(attrs.at("gate_first"), "attrs.gate_first");
      break;
    case Op::attention_block:
      required("num_heads");
      spec.block_heads = integer("num_heads");
      break;
    case Op::flex_attention:
    case Op::flex_attention_backward:
      parse_flex_attrs(attrs, r, spec.flex);
      break;
  }

  // inputs
  if (!j.contains("inputs")) r.error("inputs", "is missing");
  const json& inputs = r.object(j.at("inputs"), "inputs");
  std::vector<std::string> allowed = info->required_inputs;
  allowed.insert(allowed.end(), info->optional_inputs.begin(), info->optional_inputs.end());
  std::vector<std::string> outputs = info->outputs;
  if (is_flex(spec.op)) {
    for (const auto& t : flex_tensors(spec.flex)) {
      if (std::find(allowed.begin(), allowed.end(), t->name) == allowed.end()) {
        allowed.push_back(t->name);
      }
    }
    if (spec.op == Op::flex_attention_backward) {
      for (const auto& t : spec.flex.score_mod.tensors()) {
        if (t.type == ModType::real) outputs.push_back("d" + t.name);
      }
    }
  }
  for (const auto& [key, value] : inputs.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      r.error("inputs." + key, std::string("unknown input for op ") + info->name +
                                   " (its inputs: " + join(allowed) + ")");
    }
    if (!value.is_string() || value.get<std::string>().empty()) {
      r.error("inputs." + key, "must be a non-empty file name, got " + describe_json(value));
    }
    spec.inputs[key] = value.get<std::string>();
  }
  for (const auto& name : info->required_inputs) {
    if (!spec.inputs.count(name)) {
      r.error("inputs." + name, std::string("missing input (op ") + info->name + " needs " +
                                    join(info->required_inputs) + ")");
    }
  }
  if (is_flex(spec.op)) check_flex_inputs(spec, *info, r);

  // expected
  if (j.contains("expected")) {
    const json& expected = r.object(j.at("expected"), "expected");
    for (const auto& [key, value] : expected.items()) {
      if (std::find(outputs.begin(), outputs.end(), key) == outputs.end()) {
        r.error("expected." + key, std::string("unknown output for op ") + info->name +
                                       " (its outputs: " + join(outputs) + ")");
      }
      if (!value.is_string() || value.get<std::string>().empty()) {
        r.error("expected." + key, "must be a non-empty file name, got " + describe_json(value));
      }
      spec.expected[key] = value.get<std::string>();
    }
  }

  // tolerance
  if (j.contains("tolerance")) {
    const json& tol = r.object(j.at("tolerance"), "tolerance");
    for (const auto& [key, value] : tol.items()) {
      if (key != "rtol" && key != "atol") r.error("tolerance." + key, "unknown key (rtol, atol)");
      const double v = r.number(value, "tolerance." + key);
      if (v < 0) r.error("tolerance." + key, "= " + describe_json(value) + " must be >= 0");
      (key == "rtol" ? spec.tolerance.rtol : spec.tolerance.atol) = v;
      spec.tolerance_keys.insert(key);
    }
    spec.tolerance_from_case = true;
  }
  return spec;
}

// ---- plans ---------------------------------------------------------------------

namespace {

/// The input a library parameter name is about ("q.shape" → "q", "Hkv" → "k"), if any.
std::optional<std::string> tensor_of_parameter(const CaseSpec& spec, const std::string& param) {
  const std::string head = param.substr(0, param.find('.'));
  if (spec.inputs.count(head)) return head;
  if (spec.attrs_given.count(param)) return std::nullopt;  // the attr the case sets
  static const std::map<std::string, std::string> attention = {{"Hkv", "k"},
                                                               {"Dv", "v"},
                                                               {"Sq", "q"},
                                                               {"Sk", "k"},
                                                               {"B", "q"},
                                                               {"q_row_stride", "q"},
                                                               {"k_row_stride", "k"},
                                                               {"v_row_stride", "v"},
                                                               {"bias_batch", "mask"},
                                                               {"bias_heads", "mask"},
                                                               {"num_seqs", "cu_seqlens_q"},
                                                               {"num_blocks", "k"},
                                                               {"block_size", "k"},
                                                               {"max_blocks", "block_table"}};
  static const std::map<std::string, std::string> rope = {
      {"batch", "x"},          {"seq", "x"},
      {"width", "x"},          {"table_rows", "cos"},
      {"table_stride", "cos"}, {"src_row_stride", "x"},
      {"k_width", "k"},        {"k_src_row_stride", "k"}};
  static const std::map<std::string, std::string> swiglu = {{"rows", "x"}, {"n", "x"}};
  static const std::map<std::string, std::string> block = {
      {"embed", "x"},        {"batch", "x"},          {"seq", "x"},
      {"table_rows", "cos"}, {"table_stride", "cos"}, {"keep", "mask"}};
  static const std::map<std::string, std::string> flex = {
      {"B", "q"},
      {"H", "q"},
      {"Sq", "q"},
      {"D", "q"},
      {"Hkv", "k"},
      {"Sk", "k"},
      {"Dv", "v"},
      {"block_mask.B", "kv_num_blocks"},
      {"block_mask.H", "kv_num_blocks"},
      {"block_mask.width", "kv_indices"},
      {"block_mask.full_width", "full_kv_indices"}};
  const std::map<std::string, std::string>* aliases = nullptr;
  switch (spec.op) {
    case Op::flex_attention:
    case Op::flex_attention_backward:
      aliases = &flex;
      break;
    case Op::attention:
    case Op::attention_backward:
      aliases = &attention;
      break;
    case Op::rope:
    case Op::rope_backward:
    case Op::rope_qk:
    case Op::rope_qk_backward:
    case Op::axial_rope:
    case Op::axial_rope_backward:
      aliases = &rope;
      break;
    case Op::swiglu:
    case Op::swiglu_backward:
      aliases = &swiglu;
      break;
    case Op::attention_block:
      aliases = &block;
      break;
  }
  auto it = aliases->find(param);
  if (it == aliases->end()) return std::nullopt;
  std::string name = it->second;
  // The backward ops read dout where the forward reads x; the q-and-k ops read
  // q (dq_out) for x and dk_out for k.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"x", "dout"}, {"x", "q"}, {"x", "dq_out"}, {"k", "dk_out"}}) {
    if (name == from && !spec.inputs.count(name) && spec.inputs.count(to)) name = to;
  }
  if (!spec.inputs.count(name)) return std::nullopt;
  return name;
}

std::string shapes_summary(const CaseSpec& spec, const std::map<std::string, Shape>& shapes) {
  std::string s;
  for (const auto& [name, shape] : shapes) {
    auto it = spec.inputs.find(name);
    s += (s.empty() ? "" : ", ") + name + " " + to_string(shape);
    if (it != spec.inputs.end()) s += " (" + it->second + ")";
  }
  return s;
}

Shape replace_last(Shape s, std::int64_t last) {
  s.back() = last;
  return s;
}

/// Throws Error (parameter `<name>.shape`) unless input `name` has rank 4.
const Shape& rank4(const std::map<std::string, Shape>& shapes, const std::string& name) {
  const Shape& s = shapes.at(name);
  require(s.size() == 4, name + ".shape", to_string(s),
          "must have rank 4: flex_attention takes bhsd tensors (SPEC §13.4)");
  return s;
}

/// The block mask's shape from its inputs' shapes: counts `[B',H',nQ]`,
/// indices `[B',H',nQ,width]`, the full pair alike (nQ is checked against
/// the plan by plan_flex). Throws Error.
FlexBlockMaskShape flex_block_mask_shape(const CaseSpec& spec,
                                         const std::map<std::string, Shape>& shapes) {
  const Shape& num = shapes.at("kv_num_blocks");
  require(num.size() == 3, "kv_num_blocks.shape", to_string(num), "must be [B', H', nQ]");
  const auto width = [&](const char* name) {
    const Shape& idx = shapes.at(name);
    require(idx.size() == 4 && std::equal(num.begin(), num.end(), idx.begin()),
            std::string(name) + ".shape", to_string(idx),
            "must be [B', H', nQ, width] with kv_num_blocks' " + to_string(num));
    // A zero width would mean "the default" to the plan: a file says it.
    require(idx[3] >= 1, std::string(name) + ".shape", to_string(idx), "must have a width >= 1");
    return idx[3];
  };
  FlexBlockMaskShape m;
  m.q_block = spec.flex.q_block;
  m.kv_block = spec.flex.kv_block;
  m.B = num[0];
  m.H = num[1];
  m.width = width("kv_indices");
  if (shapes.count("full_kv_num_blocks")) {
    const Shape& fnum = shapes.at("full_kv_num_blocks");
    require(fnum == num, "full_kv_num_blocks.shape", to_string(fnum),
            "must be kv_num_blocks' " + to_string(num));
    m.has_full = true;
    m.full_width = width("full_kv_indices");
  }
  return m;
}

/// The plan of a flex case from its shapes (SPEC §13.4, §9.7): q
/// `[B,H,Sq,D]`, k `[B,Hkv,Sk,D]`, v `[B,Hkv,Sk,Dv]`, Hkv < H is GQA; each
/// captured tensor has the shape its node list declares; a block mask's
/// counts are `[B',H',nQ]` and its indices `[B',H',nQ,width]`. Throws Error.
PlannedCase plan_flex(const CaseSpec& spec, const std::map<std::string, Shape>& shapes) {
  FlexParams p =
      flex_params_from_shapes(rank4(shapes, "q"), rank4(shapes, "k"), rank4(shapes, "v"));
  p.scale = spec.flex.scale;
  p.score_mod = spec.flex.score_mod;
  p.mask_mod = spec.flex.mask_mod;
  for (const auto* t : flex_tensors(spec.flex)) {
    require(shapes.at(t->name) == t->shape, t->name + ".shape", to_string(shapes.at(t->name)),
            "must be the shape its node list declares, " + to_string(t->shape));
  }
  const bool masked = shapes.count("kv_num_blocks") != 0;
  if (masked) p.block_mask = flex_block_mask_shape(spec, shapes);
  PlannedCase pc;
  const FlexPlan plan = FlexPlan::make(std::move(p));
  if (masked) {
    const Shape& num = shapes.at("kv_num_blocks");
    require(
        num[2] == plan.q_blocks(), "kv_num_blocks.shape", to_string(num),
        "must have nQ = ceil(Sq / q_block) = " + std::to_string(plan.q_blocks()) + " query blocks");
  }
  const FlexParams& z = plan.params();
  const Shape out{z.B, z.H, z.Sq, z.Dv};
  if (spec.op == Op::flex_attention) {
    pc.outputs["out"] = out;
    pc.outputs["lse"] = Shape{z.B, z.H, z.Sq};
  } else {
    require(shapes.at("dout") == out, "dout.shape", to_string(shapes.at("dout")),
            "must be the shape of the forward output, " + to_string(out));
    pc.outputs["dq"] = shapes.at("q");
    pc.outputs["dk"] = shapes.at("k");
    pc.outputs["dv"] = shapes.at("v");
    for (const auto& t : spec.flex.score_mod.tensors()) {
      if (t.type == ModType::real) pc.outputs["d" + t.name] = t.shape;
    }
  }
  pc.plan = plan;
  return pc;
}

}  // namespace

PlannedCase plan_case(const CaseSpec& spec, const std::map<std::string, Shape>& shapes) {
  const auto shape = [&](const std::string& name) -> const Shape& {
    auto it = shapes.find(name);
    if (it == shapes.end()) {
      throw CaseError(spec.name, kCaseJson, "inputs." + name, "missing input");
    }
    return it->second;
  };
  const auto optional = [&](const std::string& name) -> std::optional<Shape> {
    auto it = shapes.find(name);
    if (it == shapes.end()) return std::nullopt;
    return it->second;
  };
  const auto file_of = [&](const std::string& name) {
    auto it = spec.inputs.find(name);
    return it == spec.inputs.end() ? std::string(kCaseJson) : it->second;
  };
  PlannedCase pc;
  try {
    switch (spec.op) {
      case Op::attention:
      case Op::attention_backward: {
        const Shape& q = shape("q");
        AttentionShapes s{q, shape("k"), shape("v"), optional("mask")};
        for (const auto& [name, member] : kFeatureShapes) s.*member = optional(name);
        AttentionNames names;
        names.mask = "mask";  // a case file's mask input, of either kind (SPEC §9)
        AttentionParams params = attention_params_from_shapes(s, spec.attention, names);
        params.rounding = spec.rounding;
        params.kv_cache = spec.kv_cache;
        const auto plan = AttentionPlan::make(params);
        // heads on their own axis: rank 4, or packed [total, H, D]
        const bool split = q.size() == 4 || (plan.varlen() && q.size() == 3);
        const Shape out = replace_last(q, split ? plan.Dv : plan.H * plan.Dv);
        if (spec.op == Op::attention) {
          pc.outputs["out"] = out;
        } else {
          require(!plan.paged(), "block_table", plan.paged() ? to_string(shape("block_table")) : "",
                  "is forward only: attention_backward takes contiguous or packed k and v");
          require(shape("dout") == out, "dout.shape", to_string(shape("dout")),
                  "must be the shape of the forward output, " + to_string(out));
          pc.outputs["dq"] = shapes.at("q");
          pc.outputs["dk"] = shape("k");
          pc.outputs["dv"] = shape("v");
          if (plan.sinks) pc.outputs["dsinks"] = Shape{plan.H};
          if (plan.mask == MaskKind::bias) pc.outputs["dbias"] = shape("mask");  // SPEC §3
        }
        pc.plan = plan;
        break;
      }
      case Op::rope:
      case Op::rope_backward: {
        const std::string src = spec.op == Op::rope ? "x" : "dout";
        const auto plan = RopePlan::from_shapes(shape(src), shape("cos"), shape("sin"),
                                                optional("positions"), spec.rope);
        pc.outputs[spec.op == Op::rope ? "out" : "dx"] = shape(src);
        pc.plan = plan;
        break;
      }
      case Op::rope_qk:
      case Op::rope_qk_backward: {
        const bool fwd = spec.op == Op::rope_qk;
        const Shape& q = shape(fwd ? "q" : "dq_out");
        const Shape& k = shape(fwd ? "k" : "dk_out");
        pc.plan = RopeQkPlan::from_shapes(q, k, shape("cos"), shape("sin"), optional("positions"),
                                          spec.rope);
        pc.outputs[fwd ? "q_out" : "dq"] = q;
        pc.outputs[fwd ? "k_out" : "dk"] = k;
        break;
      }
      case Op::axial_rope:
      case Op::axial_rope_backward: {
        const std::string src = spec.op == Op::axial_rope ? "x" : "dout";
        const auto plan = AxialRopePlan::from_shapes(shape(src), spec.axial);
        pc.outputs[spec.op == Op::axial_rope ? "out" : "dx"] = shape(src);
        pc.plan = plan;
        break;
      }
      case Op::swiglu:
      case Op::swiglu_backward: {
        const Shape& x = shape("x");
        const auto plan = SwigluPlan::from_shapes(x, spec.gate_first);
        const Shape out = replace_last(x, plan.n);
        if (spec.op == Op::swiglu) {
          pc.outputs["out"] = out;
        } else {
          require(shape("dout") == out, "dout.shape", to_string(shape("dout")),
                  "must be the shape of the forward output, " + to_string(out));
          pc.outputs["dx"] = x;
        }
        pc.plan = plan;
        break;
      }
      case Op::attention_block: {
        const Shape& x = shape("x");
        const auto plan = AttentionBlockPlan::from_shapes(
            x, shape("w_qkv"), optional("b_qkv"), shape("w_out"), optional("b_out"),
            optional("mask"), optional("cos"), optional("sin"), spec.block_heads, "mask");
        pc.outputs["out"] = x;
        pc.plan = plan;
        break;
      }
      case Op::flex_attention:
      case Op::flex_attention_backward:
        pc = plan_flex(spec, shapes);
        break;
    }
  } catch (const Error& e) {
    const std::string& param = e.parameter();
    const OpInfo& info = op_info(spec.op);
    std::string file = kCaseJson, field = param;
    if (auto tensor = tensor_of_parameter(spec, param)) {
      file = file_of(*tensor);
      if (field.find('.') == std::string::npos && *tensor != param) {
        field = *tensor + " (" + param + ")";
      }
    } else if (std::find(info.attrs.begin(), info.attrs.end(), param) != info.attrs.end()) {
      field = attr_field(param);
    }
    throw CaseError(spec.name, file, field,
                    std::string(e.what()) + " [inputs: " + shapes_summary(spec, shapes) + "]");
  }
  return pc;
}

// ---- loading -------------------------------------------------------------------

namespace {

bool is_low_precision(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

/// How a tensor of storage type `t` is held in a .npy file (SPEC §9.4):
/// bf16 as its bits, `<u2`, since NumPy has no bfloat16.
NpyDtype storage_descr(DType t) {
  return t == DType::bf16 ? NpyDtype::u2 : t == DType::f16 ? NpyDtype::f2 : NpyDtype::f4;
}

/// The values of a `<u2` array read as bfloat16 bit patterns (exact in float32).
void decode_bf16(NpyArray& a) {
  for (std::size_t i = 0; i < a.values.size(); ++i) {
    a.values[i] = static_cast<float>(
        static_cast<double>(bfloat16::from_bits(static_cast<std::uint16_t>(a.integers[i]))));
  }
}

std::pair<std::vector<NpyDtype>, std::string> storage_dtypes(DType t);

/// The dtypes an input of the case may have, and why, for messages.
std::pair<std::vector<NpyDtype>, std::string> allowed_dtypes(const CaseSpec& spec,
                                                             const std::string& name) {
  using D = NpyDtype;
  const bool attention = spec.op == Op::attention || spec.op == Op::attention_backward;
  if (is_flex(spec.op)) {
    const bool block_mask = name == "kv_num_blocks" || name == "kv_indices" ||
                            name == "full_kv_num_blocks" || name == "full_kv_indices";
    if (block_mask) return {{D::i4, D::i8}, "a block mask's indices are <i4 or <i8"};
    for (const auto* t : flex_tensors(spec.flex)) {
      if (t->name == name && t->type == ModType::integer) {
        return {{D::i4, D::i8}, "an integer tensor of a mod is <i4 or <i8 (SPEC §9.7)"};
      }
    }
    return storage_dtypes(spec.dtype);  // q, k, v, dout and the mods' real tensors
  }
  if (is_index_input(name)) return {{D::i4, D::i8}, "index inputs are <i4 or <i8"};
  if (name == "mask") {
    const bool keep =
        attention ? spec.attention.mask == MaskKind::key_padding : spec.op == Op::attention_block;
    if (keep)
      return {{D::f4, D::f8, D::b1, D::i4, D::i8}, "a keep mask is <f4, <f8, |b1, <i4 or <i8"};
    return {{D::f4, D::f8}, "a bias is float32 whatever the storage type (<f4 or <f8, SPEC §10.1)"};
  }
  if (name == "alibi_slopes" || name == "k_scale" || name == "v_scale") {
    return {{D::f4, D::f8},
            name + " is float32 whatever the storage type (<f4 or <f8, SPEC §10.1)"};
  }
  if ((name == "k" || name == "v") && spec.kv_cache != KvCache::plain) {
    const bool int8 = spec.kv_cache == KvCache::int8;
    return {{int8 ? D::i1 : D::u1},
            std::string("attrs.kv_cache = ") + to_string(spec.kv_cache) + " reads " + name +
                " as " + (int8 ? "int8 codes (|i1)" : "e4m3 code bytes (|u1)") + " (SPEC §10.4)"};
  }
  return storage_dtypes(spec.dtype);
}

/// The dtypes of a storage tensor of a case of storage type `t`, and why.
std::pair<std::vector<NpyDtype>, std::string> storage_dtypes(DType t) {
  using D = NpyDtype;
  switch (t) {
    case DType::bf16:
      return {{D::u2},
              "the case's \"dtype\" is \"bf16\": every storage tensor is bfloat16 bits (<u2); "
              "one storage type per call (SPEC §10.1)"};
    case DType::f16:
      return {{D::f2},
              "the case's \"dtype\" is \"f16\": every storage tensor is <f2; one storage type "
              "per call (SPEC §10.1)"};
    default:
      return {{D::f4, D::f8},
              "float tensors are <f4 or <f8 (<f2 needs \"dtype\": \"f16\" and <u2 \"dtype\": "
              "\"bf16\"; |b1, <i4 and <i8 only for a key_padding keep mask and index inputs)"};
  }
}

/// Throws a CaseError naming the first input whose dtype the case does not
/// allow; decodes bf16 bit patterns.
void check_input_dtypes(Case& c) {
  for (auto& [name, t] : c.inputs) {
    const auto [allowed, why] = allowed_dtypes(c.spec, name);
    if (std::find(allowed.begin(), allowed.end(), t.array.dtype) == allowed.end()) {
      throw CaseError(
          c.spec.name, t.file, "inputs." + name,
          std::string("dtype ") + to_string(t.array.dtype) + " is not allowed here: " + why);
    }
    if (t.array.dtype == NpyDtype::u2) decode_bf16(t.array);
  }
}

/// The library's value checks of the attention inputs (sinks, slopes, index
/// inputs; the codes' sizes and the scales of a quantized cache).
void check_attention_values(const Case& c) {
  const auto& plan = std::get<AttentionPlan>(c.planned.plan);
  if (plan.kv_cache == KvCache::plain) {
    check_inputs(plan, attention_inputs(c));
    return;
  }
  AttentionInputs<float> in = attention_inputs(c);
  in.k = {};
  in.v = {};
  const auto& k = c.inputs.at("k").array;
  const auto& v = c.inputs.at("v").array;
  const std::vector<std::uint8_t> kc(k.integers.size()), vc(v.integers.size());
  check_inputs(plan, in,
               QuantizedKv{kc, vc, c.inputs.at("k_scale").array.values,
                           c.inputs.at("v_scale").array.values});
}

/// The library's value checks of a flex case (FlexPlan::check_inputs: the
/// integer tensors within their declared ranges, the block mask's counts and
/// indices), an Error reported against the input's file.
void check_flex_values(const Case& c) {
  const auto& plan = std::get<FlexPlan>(c.planned.plan);
  try {
    const auto real = [&](const std::string& name) {
      return std::span<const float>(c.inputs.at(name).array.values);
    };
    plan.check_inputs(flex_inputs<float>(c, real), static_cast<std::size_t>(plan.out_size()), 0);
  } catch (const Error& e) {
    std::string param = e.parameter();
    for (const char* prefix : {"score_mod tensor ", "mask_mod tensor ", "block_mask."}) {
      if (param.rfind(prefix, 0) == 0) param = param.substr(std::string(prefix).size());
    }
    const auto it = c.inputs.find(param);
    throw CaseError(c.spec.name, it != c.inputs.end() ? it->second.file : kCaseJson,
                    "inputs." + param, e.what());
  }
}

}  // namespace

std::vector<std::string> output_names(const Case& c) {
  std::vector<std::string> names;
  for (const auto& n : op_info(c.spec.op).outputs) {
    if (c.planned.outputs.count(n)) names.push_back(n);
  }
  if (c.spec.op == Op::flex_attention_backward) {
    for (const auto& t : c.spec.flex.score_mod.tensors()) {
      if (t.type == ModType::real) names.push_back("d" + t.name);
    }
  }
  return names;
}

AttentionInputs<float> attention_inputs(const Case& c) {
  const auto tensor = [&](const char* name) -> const NpyArray* {
    auto it = c.inputs.find(name);
    return it == c.inputs.end() ? nullptr : &it->second.array;
  };
  const auto values = [&](const char* name) -> std::span<const float> {
    const NpyArray* a = tensor(name);
    return a != nullptr ? std::span<const float>(a->values) : std::span<const float>();
  };
  AttentionInputs<float> in{values("q"), values("k"), values("v"), values("mask")};
  in.sinks = values("sinks");
  in.alibi_slopes = values("alibi_slopes");
  for (const auto& [name, member] : kIndexInputs) {
    if (const NpyArray* a = tensor(name)) in.*member = Indices(a->integers);
  }
  return in;
}

Case load_case(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw CaseError(dir, dir, "", "is not a directory (a case is a directory with case.json)");
  }
  const fs::path json_path = root / kCaseJson;
  if (!fs::is_regular_file(json_path, ec)) {
    throw CaseError(dir, kCaseJson, "", "missing file (" + json_path.string() + ")");
  }
  std::string text;
  {
    std::ifstream in(json_path, std::ios::binary);
    std::ostringstream buf;
    buf << in.rdbuf();
    if (!in) throw CaseError(dir, kCaseJson, "", "cannot read " + json_path.string());
    text = buf.str();
  }
  Case c;
  c.spec = parse_case_json(text, dir);

  const auto read = [&](const std::string& section, const std::string& name,
                        const std::string& file) {
    const fs::path p = root / file;
    if (!fs::exists(p, ec)) {
      throw CaseError(dir, file, section + "." + name, "missing file (" + p.string() + ")");
    }
    try {
      return CaseTensor{file, read_npy(p.string())};
    } catch (const NpyError& e) {
      throw CaseError(dir, file, section + "." + name + " (npy " + e.field() + ")", e.what());
    }
  };
  const bool attention = c.spec.op == Op::attention || c.spec.op == Op::attention_backward;
  std::map<std::string, Shape> shapes;
  for (const auto& [name, file] : c.spec.inputs) {
    CaseTensor t = read("inputs", name, file);
    shapes[name] = t.array.shape;
    c.inputs.emplace(name, std::move(t));
  }
  for (const char* name : {"k_scale", "v_scale"}) {
    if (c.spec.kv_cache == KvCache::plain && c.spec.inputs.count(name)) {
      throw CaseError(dir, kCaseJson, std::string("inputs.") + name,
                      "is the scale of a quantized cache: give attrs.kv_cache int8 or e4m3");
    }
    if (c.spec.kv_cache != KvCache::plain && !c.spec.inputs.count(name)) {
      throw CaseError(dir, kCaseJson, std::string("inputs.") + name,
                      std::string("missing input (attrs.kv_cache = ") + to_string(c.spec.kv_cache) +
                          " reads k and v as codes with scales)");
    }
  }
  // Shapes first: a mask given to a mask kind that takes none is reported as
  // such by the plan, not as a dtype problem.
  c.planned = plan_case(c.spec, shapes);
  check_input_dtypes(c);
  // The values of the index inputs (and of the sinks and slopes) by the
  // library's own checks, before any backend runs.
  if (is_flex(c.spec.op)) check_flex_values(c);
  try {
    if (attention) check_attention_values(c);
    const auto* rope = std::get_if<RopePlan>(&c.planned.plan);
    if (const auto* qk = std::get_if<RopeQkPlan>(&c.planned.plan)) rope = &qk->q;
    const auto positions = c.inputs.find("positions");
    if (rope != nullptr && positions != c.inputs.end()) {
      check_positions(*rope, Indices(positions->second.array.integers));
    }
  } catch (const Error& e) {
    std::string param = e.parameter().substr(0, e.parameter().find('.'));
    if (param == "k_codes" || param == "v_codes") param = param.substr(0, 1);
    const auto it = c.inputs.find(param);
    throw CaseError(dir, it != c.inputs.end() ? it->second.file : kCaseJson, "inputs." + param,
                    e.what());
  }
  for (const auto& [name, file] : c.spec.expected) {
    if (!c.planned.outputs.count(name)) {
      throw CaseError(dir, kCaseJson, "expected." + name,
                      "is not an output of this case (dsinks needs a sinks input, dbias a "
                      "bias mask)");
    }
    CaseTensor t = read("expected", name, file);
    const auto stored = storage_descr(c.spec.dtype);
    if (!is_float(t.array.dtype) && t.array.dtype != stored) {
      throw CaseError(dir, file, "expected." + name,
                      std::string("dtype ") + to_string(t.array.dtype) +
                          " is not allowed: expected outputs are <f4 or <f8" +
                          (c.spec.dtype == DType::f32
                               ? std::string()
                               : std::string(", or ") + to_string(stored) + " (the case's " +
                                     std::string(to_string(c.spec.dtype)) + ")"));
    }
    if (t.array.dtype == NpyDtype::u2) decode_bf16(t.array);
    const Shape& want = c.planned.outputs.at(name);
    if (t.array.shape != want) {
      throw CaseError(
          dir, file, "expected." + name,
          "shape " + to_string(t.array.shape) + " is not the output's shape " + to_string(want));
    }
    c.expected.emplace(name, std::move(t));
  }
  if (is_low_precision(c.spec.dtype) || is_flex(c.spec.op)) {
    const Tolerance derived = is_flex(c.spec.op) ? flex_tolerance(c) : low_precision_tolerance(c);
    if (!c.spec.tolerance_keys.count("rtol")) c.spec.tolerance.rtol = derived.rtol;
    if (!c.spec.tolerance_keys.count("atol")) c.spec.tolerance.atol = derived.atol;
  }
  return c;
}

// ---- comparison ------------------------------------------------------------------

Comparison compare(const std::vector<float>& got, const std::vector<float>& expected,
                   const Tolerance& tol) {
  Comparison c;
  c.count = static_cast<std::int64_t>(expected.size());
  if (got.size() != expected.size()) {
    c.mismatches = c.count > 0 ? c.count : 1;
    c.max_abs = c.max_rel = std::numeric_limits<double>::infinity();
    return c;
  }
  constexpr double inf = std::numeric_limits<double>::infinity();
  double worst_excess = -inf;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double g = got[i], e = expected[i];
    double diff = 0.0, excess = 0.0;
    bool ok = true;
    if (std::isnan(e) || std::isnan(g)) {
      ok = std::isnan(e) && std::isnan(g);
      diff = ok ? 0.0 : inf;
    } else if (std::isinf(e) || std::isinf(g)) {
      ok = g == e;
      diff = ok ? 0.0 : inf;
    } else {
      diff = std::fabs(g - e);
      ok = diff <= tol.atol + tol.rtol * std::fabs(e);
      if (e != 0.0) c.max_rel = std::max(c.max_rel, diff / std::fabs(e));
    }
    if (!std::isfinite(diff)) c.max_rel = inf;
    c.max_abs = std::max(c.max_abs, diff);
    if (!ok) {
      ++c.mismatches;
      excess = std::isfinite(diff) ? diff - (tol.atol + tol.rtol * std::fabs(e)) : inf;
      if (excess > worst_excess) {
        worst_excess = excess;
        c.worst = static_cast<std::int64_t>(i);
      }
    }
  }
  return c;
}

std::string index_string(const Shape& shape, std::int64_t index) {
  std::vector<std::int64_t> idx(shape.size(), 0);
  for (std::size_t k = shape.size(); k-- > 0;) {
    if (shape[k] > 0) {
      idx[k] = index % shape[k];
      index /= shape[k];
    }
  }
  return to_string(idx);
}

}  // namespace tandem::tool
