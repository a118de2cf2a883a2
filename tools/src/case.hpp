// SPDX-License-Identifier: Apache-2.0
/// @file case.hpp
/// @brief Case files (SPEC §9): parsing `case.json`, reading the `.npy`
///        tensors, building the op's plan through the library's own shape
///        rules (`Plan::from_shapes`), running it on a Backend and comparing
///        the outputs with the expected tensors.
///
/// Loading happens in three steps so that each can be tested (and fuzzed)
/// alone: parse_case_json() checks the JSON (op, attrs, input and output
/// names, tolerance); plan_case() turns the input shapes into a plan and the
/// output shapes; load_case() reads the files and does both. Every problem is
/// a CaseError naming the case, the file and the field.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "npy.hpp"
#include "tandem/tandem.hpp"

namespace tandem::tool {

/// A case that cannot be run. what() is
/// `case '<case>': <file>: <field>: <detail>`.
class CaseError : public std::runtime_error {
 public:
  CaseError(std::string case_name, std::string file, std::string field, std::string detail);
  [[nodiscard]] const std::string& case_name() const noexcept { return case_; }
  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] const std::string& field() const noexcept { return field_; }
  [[nodiscard]] const std::string& detail() const noexcept { return detail_; }

 private:
  std::string case_, file_, field_, detail_;
};

/// A backend that does not offer the entry point a case needs (an empty
/// std::function in its Kernels<T>).
class NotOffered : public CaseError {
 public:
  using CaseError::CaseError;
};

/// The ops a case can name.
enum class Op {
  attention,
  attention_backward,
  rope,
  rope_backward,
  rope_qk,
  rope_qk_backward,
  axial_rope,
  axial_rope_backward,
  swiglu,
  swiglu_backward,
  attention_block,
  flex_attention,
  flex_attention_backward,
};

/// Per-element tolerance: an output passes when every element satisfies
/// |got − exp| <= atol + rtol·|exp| (NaN matches only NaN, ±inf only itself).
struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;
};

/// What a case file may say about one op.
struct OpInfo {
  Op op;
  const char* name;
  std::vector<std::string> required_inputs;
  std::vector<std::string> optional_inputs;
  std::vector<std::string> outputs;
  std::vector<std::string> attrs;  ///< every attr the op accepts
  Tolerance tolerance;             ///< the default for float32 results
};

/// All ops, in the order of SPEC §9's table.
const std::vector<OpInfo>& op_table();
/// True for the inputs that hold integer indices (`<i4` or `<i8`): RoPE's
/// positions and attention's offsets, lengths and block table (SPEC §4.6,
/// §2.9–2.10).
bool is_index_input(const std::string& name);
/// The entry of `op`.
const OpInfo& op_info(Op op);

/// The attrs of flex_attention and flex_attention_backward (SPEC §9.7): the
/// programs built from their node lists, the scale and the block mask's
/// block sizes (the mask itself is four index inputs).
struct FlexAttrs {
  ModProgram score_mod;         ///< `attrs.score_mod` (empty: t = s)
  ModProgram mask_mod;          ///< `attrs.mask_mod` (empty: every key of a kept block)
  std::optional<double> scale;  ///< `attrs.scale` (1/√D)
  std::int64_t q_block = 128;   ///< `attrs.block_size` [0] (torch's BLOCK_SIZE)
  std::int64_t kv_block = 128;  ///< `attrs.block_size` [1]
};

/// True for flex_attention and flex_attention_backward.
bool is_flex(Op op);

/// case.json, checked: the op, its typed attrs, file names and tolerance.
struct CaseSpec {
  /// `"dtype"`: the call's storage type T (SPEC §9.4, §10.1): f32 (the default),
  /// bf16 or f16.
  DType dtype = DType::f32;
  Rounding rounding = kRoundingPytorch;  ///< `"rounding"` (SPEC §10.3)
  bool rounding_given = false;
  KvCache kv_cache = KvCache::plain;     ///< `attrs.kv_cache` of attention (SPEC §10.4)
  std::set<std::string> tolerance_keys;  ///< the keys the case's "tolerance" gives
  std::string name;                      ///< the case directory as given by the user
  Op op = Op::attention;
  std::map<std::string, std::string> inputs;    ///< input name → file
  std::map<std::string, std::string> expected;  ///< output name → file
  Tolerance tolerance;                          ///< the case's, else the op's default
  bool tolerance_from_case = false;
  std::set<std::string> attrs_given;  ///< the attrs case.json sets

  AttentionAttrs attention;      ///< attention, attention_backward
  RopeAttrs rope;                ///< rope, rope_backward, rope_qk, rope_qk_backward
  AxialRopeAttrs axial;          ///< axial_rope, axial_rope_backward
  bool gate_first = true;        ///< swiglu, swiglu_backward
  std::int64_t block_heads = 0;  ///< attention_block
  FlexAttrs flex;                ///< flex_attention, flex_attention_backward
};

/// Parses and checks the text of case.json. Throws CaseError naming
/// `case_name`, "case.json" and the field.
CaseSpec parse_case_json(std::string_view text, const std::string& case_name);

/// A validated plan of any op.
using Plan = std::variant<AttentionPlan, RopePlan, RopeQkPlan, AxialRopePlan, SwigluPlan,
                          AttentionBlockPlan, FlexPlan>;

/// The plan of a case and the shapes of all its outputs.
struct PlannedCase {
  Plan plan;
  std::map<std::string, Shape> outputs;
};

/// Builds the plan from the input shapes with the library's from_shapes,
/// checks the shape of `dout` (it must be the forward output's) and derives
/// the output shapes. A tandem::Error becomes a CaseError naming the file of
/// the tensor (or case.json for an attr) and the parameter.
PlannedCase plan_case(const CaseSpec& spec, const std::map<std::string, Shape>& input_shapes);

/// One tensor of a case and the file it came from.
struct CaseTensor {
  std::string file;
  NpyArray array;
};

/// A case ready to run.
struct Case {
  CaseSpec spec;
  std::map<std::string, CaseTensor> inputs;
  std::map<std::string, CaseTensor> expected;
  PlannedCase planned;
};

/// The views of a flex case's call at storage type T: q, k, v and the mods'
/// real tensors from `real(name)` (a std::span<const T>), the integer
/// tensors and the block mask's indices as their exact integers.
template <class T, class Real>
FlexInputs<T> flex_inputs(const Case& c, const Real& real) {
  const auto integers = [&](const std::string& name) {
    auto it = c.inputs.find(name);
    return it == c.inputs.end() ? Indices() : Indices(it->second.array.integers);
  };
  const auto captures = [&](const ModProgram& p) {
    ModCaptures<T> out;
    for (const auto& t : p.tensors()) {
      const bool is_real = t.type == ModType::real;
      out.real.push_back(is_real ? real(t.name) : std::span<const T>());
      out.integer.push_back(is_real ? Indices() : integers(t.name));
    }
    return out;
  };
  FlexInputs<T> in{real("q"),
                   real("k"),
                   real("v"),
                   captures(c.spec.flex.score_mod),
                   captures(c.spec.flex.mask_mod),
                   {}};
  in.block_mask = {integers("kv_num_blocks"), integers("kv_indices"),
                   integers("full_kv_num_blocks"), integers("full_kv_indices")};
  return in;
}

/// Reads `<dir>/case.json` and every file it names, builds the plan, checks
/// the dtypes (index inputs — positions, cu_seqlens_q/k, seqused_k,
/// block_table, cache_seqlens — are `<i4` or `<i8`; other tensors float),
/// the values of the position ids (the library's check_positions) and of the
/// attention feature inputs (its check_inputs), and that each expected tensor
/// has its output's shape. Throws CaseError.
Case load_case(const std::string& dir);

/// The attention inputs of a loaded case as views into its tensors (index
/// inputs through their exact integers), in float32: what the library's
/// value checks read.
AttentionInputs<float> attention_inputs(const Case& c);

/// The default tolerance of a case of storage type bf16 or f16, derived
/// from SPEC §10.5 (the derivation is SPEC §9.5), for the inputs of `c`.
Tolerance low_precision_tolerance(const Case& c);

/// The outputs of a case in report order: the op's (op_table) that the
/// case has, then the gradients of a flex score_mod's real tensors.
std::vector<std::string> output_names(const Case& c);

/// The default tolerance of a flex_attention or flex_attention_backward
/// case of any storage type, float32 included (SPEC §9.7).
Tolerance flex_tolerance(const Case& c);

/// Runs the case on `backend` at the case's storage type (and, when given,
/// with `rounding` instead of the case's profile); returns every output of
/// the op, contiguous, by name, as float32 (exact for bf16 and f16). Throws
/// CaseError when the backend does not offer the entry point or rejects the
/// call.
std::map<std::string, std::vector<float>> run_case(const Case& c, const Backend& backend,
                                                   std::optional<Rounding> rounding = {});

/// The result of comparing one output with its expected values.
struct Comparison {
  double max_abs = 0.0;  ///< max |got − exp| (inf where a non-finite value differs)
  double max_rel = 0.0;  ///< max |got − exp| / |exp| over elements with exp != 0
  std::int64_t mismatches = 0;
  std::int64_t count = 0;
  std::int64_t worst = -1;  ///< index of the first element with the largest excess, -1 if none
  [[nodiscard]] bool pass() const { return mismatches == 0; }
};

/// Compares `got` with `expected` element by element (same length).
Comparison compare(const std::vector<float>& got, const std::vector<float>& expected,
                   const Tolerance& tol);

/// The multi-index of flat element `index` of a C-order `shape`, "[0, 3, 1]".
std::string index_string(const Shape& shape, std::int64_t index);

}  // namespace tandem::tool
