// SPDX-License-Identifier: Apache-2.0
// The case loader: case.json parsing (typed attrs, unknown and mistyped
// fields), plans built through from_shapes with errors mapped to files,
// output shapes, the comparison rule and running on a backend.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "case.hpp"

namespace tandem::tool {
namespace {

CaseError error_of(const std::string& json) {
  try {
    parse_case_json(json, "c");
  } catch (const CaseError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << json;
  return CaseError("", "", "", "");
}

CaseError plan_error(const std::string& json, const std::map<std::string, Shape>& shapes) {
  const CaseSpec spec = parse_case_json(json, "c");
  try {
    plan_case(spec, shapes);
  } catch (const CaseError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << json;
  return CaseError("", "", "", "");
}

const char* kAttention =
    R"({"op": "attention", "inputs": {"q": "q.npy", "k": "k.npy", "v": "v.npy"},
                             "attrs": {"num_heads": 4, "mask": "sliding_window", "window": 3,
                                       "scale": 0.5, "softcap": 30, "layout": "bhsd"}})";

TEST(CaseJson, ParsesTypedAttrsAndDefaults) {
  const CaseSpec s = parse_case_json(kAttention, "dir");
  EXPECT_EQ(s.name, "dir");
  EXPECT_EQ(s.op, Op::attention);
  EXPECT_EQ(s.attention.num_heads, 4);
  EXPECT_EQ(s.attention.mask, MaskKind::sliding_window);
  EXPECT_EQ(s.attention.window, 3);
  ASSERT_TRUE(s.attention.scale.has_value());
  EXPECT_EQ(*s.attention.scale, 0.5);
  EXPECT_EQ(s.attention.softcap, 30.0);
  ASSERT_TRUE(s.attention.layout.has_value());
  EXPECT_EQ(*s.attention.layout, tandem::QkvLayout::bhsd);
  EXPECT_EQ(s.inputs.at("k"), "k.npy");
  EXPECT_FALSE(s.tolerance_from_case);
  EXPECT_EQ(s.tolerance.rtol, op_info(Op::attention).tolerance.rtol);
  EXPECT_EQ(s.tolerance.atol, op_info(Op::attention).tolerance.atol);

  const CaseSpec r = parse_case_json(
      R"({"op": "rope_backward", "attrs": {"n_rot": 4, "style": "gptj", "table_rows": "token"},
          "inputs": {"dout": "a.npy", "cos": "c.npy", "sin": "s.npy"},
          "expected": {"dx": "e.npy"}, "tolerance": {"atol": 0.25}})",
      "r");
  EXPECT_FALSE(r.rope.head_dim.has_value());
  EXPECT_EQ(r.rope.n_rot, 4);
  EXPECT_EQ(r.rope.style, RopeStyle::gptj);
  EXPECT_EQ(r.rope.table_rows, TableRows::token);
  EXPECT_TRUE(r.tolerance_from_case);
  EXPECT_EQ(r.tolerance.atol, 0.25);
  EXPECT_EQ(r.tolerance.rtol, op_info(Op::rope_backward).tolerance.rtol);  // not given: default
  EXPECT_EQ(r.expected.at("dx"), "e.npy");
}

TEST(CaseJson, EveryOpHasItsAttrsAndATolerance) {
  for (const auto& op : op_table()) {
    EXPECT_GT(op.tolerance.rtol, 0.0) << op.name;
    EXPECT_GT(op.tolerance.atol, 0.0) << op.name;
    EXPECT_FALSE(op.outputs.empty()) << op.name;
    EXPECT_EQ(&op_info(op.op), &op) << op.name;
  }
  // Backward passes are checked more loosely than their forwards.
  EXPECT_GT(op_info(Op::attention_backward).tolerance.rtol, op_info(Op::attention).tolerance.rtol);
}

TEST(CaseJson, ErrorsNameTheField) {
  struct Bad {
    const char* json;
    const char* field;
    const char* detail;
  };
  const Bad bad[] = {
      {"{", "", "is not valid JSON"},
      {"[]", "(top level)", "must be a JSON object"},
      {R"({"inputs": {}})", "op", "is missing"},
      {R"({"op": "softmax", "inputs": {}})", "op", "unknown op"},
      {R"({"op": "swiglu", "inputs": {"x": "x.npy"}, "comment": 1})", "comment", "unknown key"},
      {R"({"op": "rope", "attrs": {"head_dim": 4, "window": 2}, "inputs": {}})", "attrs.window",
       "unknown attr for op rope"},
      {R"({"op": "attention", "attrs": {"num_heads": "8"}, "inputs": {}})", "attrs.num_heads",
       "must be an integer, got \"8\" (a string)"},
      {R"({"op": "attention", "attrs": {"num_heads": 8.0}, "inputs": {}})", "attrs.num_heads",
       "must be an integer"},
      {R"({"op": "attention", "attrs": {"num_heads": true}, "inputs": {}})", "attrs.num_heads",
       "must be an integer"},
      {R"({"op": "attention", "attrs": {"num_heads": 9223372036854775808}, "inputs": {}})",
       "attrs.num_heads", "does not fit"},
      {R"({"op": "attention", "attrs": {"num_heads": 2, "layout": "BSHD"}, "inputs": {}})",
       "attrs.layout", "must be one of \"bshd\", \"bhsd\""},
      {R"({"op": "rope", "attrs": {"layout": "bsd"}, "inputs": {}})", "attrs.layout",
       "must be one of \"bshd\", \"bhsd\", \"thd\""},
      {R"({"op": "rope_qk", "attrs": {"num_heads": "4"}, "inputs": {}})", "attrs.num_heads",
       "must be an integer"},
      {R"({"op": "rope", "attrs": {"table_rows": "ids"}, "inputs": {}})", "attrs.table_rows",
       "must be one of \"position\", \"token\", \"position_ids\""},
      {R"({"op": "rope_qk", "inputs": {"q": "q", "cos": "c", "sin": "s"}})", "inputs.k",
       "missing input"},
      {R"({"op": "attention", "attrs": {"num_heads": 2, "mask": 1}, "inputs": {}})", "attrs.mask",
       "must be one of"},
      {R"({"op": "attention", "attrs": {"num_heads": 2, "scale": "x"}, "inputs": {}})",
       "attrs.scale", "must be a number"},
      {R"({"op": "attention", "attrs": {}, "inputs": {}})", "attrs.num_heads", "is required"},
      {R"({"op": "swiglu", "attrs": {"gate_first": "yes"}, "inputs": {"x": "x"}})",
       "attrs.gate_first", "must be true or false"},
      {R"({"op": "axial_rope", "attrs": {"end_x": 2}, "inputs": {"x": "x"}})", "attrs.end_y",
       "is required"},
      {R"({"op": "swiglu", "inputs": {}})", "inputs.x", "missing input"},
      {R"({"op": "swiglu", "inputs": {"x": "x", "w": "w"}})", "inputs.w", "unknown input"},
      {R"({"op": "swiglu", "inputs": {"x": ""}})", "inputs.x", "non-empty file name"},
      {R"({"op": "swiglu", "inputs": {"x": "x"}, "expected": {"dx": "d"}})", "expected.dx",
       "unknown output"},
      {R"({"op": "swiglu", "inputs": {"x": "x"}, "tolerance": {"rtol": -1}})", "tolerance.rtol",
       "must be >= 0"},
      {R"({"op": "swiglu", "inputs": {"x": "x"}, "tolerance": {"eps": 1}})", "tolerance.eps",
       "unknown key"},
      {R"({"op": "swiglu", "inputs": {"x": "x", "x": "y"}})", "x", "more than once"},
  };
  for (const auto& b : bad) {
    const CaseError e = error_of(b.json);
    EXPECT_EQ(e.case_name(), "c") << b.json;
    EXPECT_EQ(e.file(), "case.json") << b.json;
    EXPECT_EQ(e.field(), b.field) << b.json;
    EXPECT_NE(e.detail().find(b.detail), std::string::npos) << b.json << "\n" << e.what();
    EXPECT_NE(std::string(e.what()).find("case 'c': case.json"), std::string::npos) << e.what();
  }
}

TEST(CasePlan, AttentionOutputShapesFollowQ) {
  const char* json = R"({"op": "attention", "attrs": {"num_heads": 4},
                         "inputs": {"q": "q", "k": "k", "v": "v"}})";
  const CaseSpec s = parse_case_json(json, "c");
  // bshd rank 4, GQA and Dv != D.
  PlannedCase p = plan_case(s, {{"q", {2, 5, 4, 8}}, {"k", {2, 7, 2, 8}}, {"v", {2, 7, 2, 3}}});
  EXPECT_EQ(p.outputs.at("out"), (Shape{2, 5, 4, 3}));
  const auto& plan = std::get<AttentionPlan>(p.plan);
  EXPECT_EQ(plan.Hkv, 2);
  EXPECT_EQ(plan.Dv, 3);
  // bhsd decided by the head axis.
  p = plan_case(s, {{"q", {2, 4, 5, 8}}, {"k", {2, 2, 7, 8}}, {"v", {2, 2, 7, 3}}});
  EXPECT_EQ(std::get<AttentionPlan>(p.plan).layout, Layout::bhsd);
  EXPECT_EQ(p.outputs.at("out"), (Shape{2, 4, 5, 3}));
  // rank 3 and rank 2: [.., S, H*Dv].
  p = plan_case(s, {{"q", {2, 5, 32}}, {"k", {2, 7, 16}}, {"v", {2, 7, 6}}});
  EXPECT_EQ(p.outputs.at("out"), (Shape{2, 5, 12}));
  p = plan_case(s, {{"q", {5, 32}}, {"k", {7, 16}}, {"v", {7, 6}}});
  EXPECT_EQ(p.outputs.at("out"), (Shape{5, 12}));
}

TEST(CasePlan, BackwardOutputsAndDoutShape) {
  const CaseSpec s = parse_case_json(
      R"({"op": "attention_backward", "attrs": {"num_heads": 2},
          "inputs": {"q": "q", "k": "k", "v": "v", "dout": "g.npy"}})",
      "c");
  const std::map<std::string, Shape> ok = {
      {"q", {1, 3, 16}}, {"k", {1, 4, 8}}, {"v", {1, 4, 4}}, {"dout", {1, 3, 8}}};
  const PlannedCase p = plan_case(s, ok);
  EXPECT_EQ(p.outputs.at("dq"), (Shape{1, 3, 16}));
  EXPECT_EQ(p.outputs.at("dk"), (Shape{1, 4, 8}));
  EXPECT_EQ(p.outputs.at("dv"), (Shape{1, 4, 4}));
  auto bad = ok;
  bad["dout"] = {1, 3, 16};
  const CaseError e = plan_error(
      R"({"op": "attention_backward", "attrs": {"num_heads": 2},
          "inputs": {"q": "q", "k": "k", "v": "v", "dout": "g.npy"}})",
      bad);
  EXPECT_EQ(e.file(), "g.npy");
  EXPECT_EQ(e.field(), "dout.shape");
  EXPECT_EQ(p.outputs.count("dbias"), 0u);  // no bias: no bias gradient

  // with mask bias the backward has a dbias output in the mask's shape (SPEC §3.1)
  const CaseSpec b = parse_case_json(
      R"({"op": "attention_backward", "attrs": {"num_heads": 2, "mask": "bias"},
          "inputs": {"q": "q", "k": "k", "v": "v", "dout": "g", "mask": "m"}})",
      "c");
  auto with_bias = ok;
  with_bias["mask"] = {1, 2, 3, 4};
  EXPECT_EQ(plan_case(b, with_bias).outputs.at("dbias"), (Shape{1, 2, 3, 4}));

  const CaseSpec sw =
      parse_case_json(R"({"op": "swiglu_backward", "inputs": {"x": "x", "dout": "d"}})", "c");
  EXPECT_EQ(plan_case(sw, {{"x", {3, 2, 10}}, {"dout", {3, 2, 5}}}).outputs.at("dx"),
            (Shape{3, 2, 10}));
}

TEST(CasePlan, FeatureInputsDecideTheFeaturesAndTheOutputs) {
  const char* att = R"({"op": "attention", "attrs": {"num_heads": 4, "mask": "causal"},
      "inputs": {"q": "q", "k": "k", "v": "v", "sinks": "s", "alibi_slopes": "a",
                 "cu_seqlens_q": "cq", "cu_seqlens_k": "ck", "seqused_k": "u"}})";
  const CaseSpec s = parse_case_json(att, "c");
  // packed [total, H, D]: out [total_q, H, Dv]
  PlannedCase p = plan_case(s, {{"q", {9, 4, 8}},
                                {"k", {11, 2, 8}},
                                {"v", {11, 2, 6}},
                                {"sinks", {4}},
                                {"alibi_slopes", {2, 4}},
                                {"cu_seqlens_q", {3}},
                                {"cu_seqlens_k", {3}},
                                {"seqused_k", {2}}});
  const auto& plan = std::get<AttentionPlan>(p.plan);
  EXPECT_EQ(plan.num_seqs, 2);
  EXPECT_TRUE(plan.sinks);
  EXPECT_EQ(plan.alibi, AlibiKind::per_batch_head);
  EXPECT_EQ(p.outputs.at("out"), (Shape{9, 4, 6}));
  // the backward of a call with sinks has a dsinks output [H]
  const CaseSpec b = parse_case_json(
      R"({"op": "attention_backward", "attrs": {"num_heads": 2},
          "inputs": {"q": "q", "k": "k", "v": "v", "dout": "g", "sinks": "s.npy"}})",
      "c");
  p = plan_case(
      b,
      {{"q", {1, 3, 16}}, {"k", {1, 4, 8}}, {"v", {1, 4, 4}}, {"dout", {1, 3, 8}}, {"sinks", {2}}});
  EXPECT_EQ(p.outputs.at("dsinks"), (Shape{2}));
  // a sinks input of the wrong shape names its file
  CaseError e = plan_error(
      R"({"op": "attention_backward", "attrs": {"num_heads": 2},
          "inputs": {"q": "q", "k": "k", "v": "v", "dout": "g", "sinks": "s.npy"}})",
      {{"q", {1, 3, 16}}, {"k", {1, 4, 8}}, {"v", {1, 4, 4}}, {"dout", {1, 3, 8}}, {"sinks", {3}}});
  EXPECT_EQ(e.file(), "s.npy");
  EXPECT_EQ(e.field(), "sinks.shape");
  // a paged cache has no backward
  e = plan_error(
      R"({"op": "attention_backward", "attrs": {"num_heads": 2},
          "inputs": {"q": "q", "k": "k", "v": "v", "dout": "g", "block_table": "t.npy",
                     "cache_seqlens": "l.npy"}})",
      {{"q", {1, 1, 2, 8}},
       {"k", {3, 4, 2, 8}},
       {"v", {3, 4, 2, 8}},
       {"dout", {1, 1, 2, 8}},
       {"block_table", {1, 2}},
       {"cache_seqlens", {1}}});
  EXPECT_EQ(e.file(), "t.npy");
  EXPECT_EQ(e.field(), "block_table");
  EXPECT_NE(e.detail().find("is forward only"), std::string::npos) << e.what();
  // cu_seqlens_q alone: the missing partner is named
  e = plan_error(R"({"op": "attention", "attrs": {"num_heads": 1},
                     "inputs": {"q": "q", "k": "k", "v": "v", "cu_seqlens_q": "cq.npy"}})",
                 {{"q", {5, 1, 8}}, {"k", {5, 1, 8}}, {"v", {5, 1, 8}}, {"cu_seqlens_q", {2}}});
  EXPECT_EQ(e.file(), "case.json");
  EXPECT_EQ(e.field(), "cu_seqlens_k");
}

TEST(CasePlan, LibraryErrorsNameTheTensorFileOrTheAttr) {
  const char* att = R"({"op": "attention", "attrs": {"num_heads": 4},
                        "inputs": {"q": "q.npy", "k": "k.npy", "v": "v.npy"}})";
  // k's last dim differs from q's: the library names k.shape.
  CaseError e = plan_error(att, {{"q", {1, 5, 4, 8}}, {"k", {1, 5, 4, 6}}, {"v", {1, 5, 4, 6}}});
  EXPECT_EQ(e.file(), "k.npy");
  EXPECT_EQ(e.field(), "k.shape");
  EXPECT_NE(e.detail().find("k.shape = [1, 5, 4, 6]"), std::string::npos) << e.what();
  EXPECT_NE(e.detail().find("[inputs: k [1, 5, 4, 6] (k.npy)"), std::string::npos) << e.what();
  // S == H: the layout is ambiguous, an attr question.
  e = plan_error(att, {{"q", {1, 4, 4, 8}}, {"k", {1, 4, 4, 8}}, {"v", {1, 4, 4, 8}}});
  EXPECT_EQ(e.file(), "case.json");
  EXPECT_EQ(e.field(), "attrs.layout");
  EXPECT_NE(e.detail().find("ambiguous"), std::string::npos);
  // kv heads that do not divide H come from k.
  e = plan_error(att, {{"q", {1, 5, 4, 8}}, {"k", {1, 5, 3, 8}}, {"v", {1, 5, 3, 8}}});
  EXPECT_EQ(e.file(), "k.npy");
  // A mask for a kind that takes none names the mask file.
  e = plan_error(R"({"op": "attention", "attrs": {"num_heads": 4},
                     "inputs": {"q": "q", "k": "k", "v": "v", "mask": "m.npy"}})",
                 {{"q", {1, 5, 4, 8}}, {"k", {1, 5, 4, 8}}, {"v", {1, 5, 4, 8}}, {"mask", {1, 5}}});
  EXPECT_EQ(e.file(), "m.npy");
  EXPECT_EQ(e.field(), "mask");
  // An attr the plan rejects.
  e = plan_error(R"({"op": "rope", "attrs": {"head_dim": 4, "n_rot": 5},
                     "inputs": {"x": "x", "cos": "c", "sin": "s"}})",
                 {{"x", {1, 3, 8}}, {"cos", {3, 2}}, {"sin", {3, 2}}});
  EXPECT_EQ(e.field(), "attrs.n_rot");
  EXPECT_NE(e.detail().find("n_rot = 5 must be even and <= head_dim = 4"), std::string::npos);
  // A derived size, named through the tensor it came from.
  e = plan_error(R"({"op": "axial_rope_backward", "attrs": {"end_x": 2, "end_y": 3},
                     "inputs": {"dout": "d.npy"}})",
                 {{"dout", {1, 7, 8}}});
  EXPECT_EQ(e.file(), "d.npy");
  EXPECT_EQ(e.field(), "dout (seq)");
  EXPECT_NE(e.detail().find("seq = 7 must equal repeat_factor*end_x*end_y = 6"), std::string::npos);
}

TEST(CasePlan, RopeLayoutsPositionsAndTheQkOps) {
  // A rank-4 x: layout explicit, or from num_heads, else an attr question.
  const CaseSpec by_heads = parse_case_json(
      R"({"op": "rope", "attrs": {"num_heads": 4},
          "inputs": {"x": "x", "cos": "c", "sin": "s", "positions": "p.npy"}})",
      "c");
  const PlannedCase pc = plan_case(
      by_heads, {{"x", {2, 5, 4, 8}}, {"cos", {9, 4}}, {"sin", {9, 4}}, {"positions", {2, 5}}});
  const auto& plan = std::get<RopePlan>(pc.plan);
  EXPECT_EQ(plan.layout, RopeLayout::bshd);
  EXPECT_EQ(plan.rows, TableRows::position_ids);
  EXPECT_EQ(pc.outputs.at("out"), (Shape{2, 5, 4, 8}));
  CaseError e = plan_error(R"({"op": "rope", "inputs": {"x": "x", "cos": "c", "sin": "s"}})",
                           {{"x", {2, 5, 4, 8}}, {"cos", {9, 4}}, {"sin", {9, 4}}});
  EXPECT_EQ(e.file(), "case.json");
  EXPECT_EQ(e.field(), "attrs.layout");
  EXPECT_NE(e.detail().find("ambiguous"), std::string::npos) << e.what();
  // positions of the wrong shape name their file.
  e = plan_error(
      R"({"op": "rope", "attrs": {"layout": "bhsd"},
          "inputs": {"x": "x", "cos": "c", "sin": "s", "positions": "p.npy"}})",
      {{"x", {2, 4, 5, 8}}, {"cos", {9, 4}}, {"sin", {9, 4}}, {"positions", {2, 4}}});
  EXPECT_EQ(e.file(), "p.npy");
  EXPECT_EQ(e.field(), "positions.shape");
  // q and k: one plan, two outputs of their inputs' shapes; k's own errors name k.
  const CaseSpec qk = parse_case_json(
      R"({"op": "rope_qk_backward", "attrs": {"layout": "thd"},
          "inputs": {"dq_out": "q.npy", "dk_out": "k.npy", "cos": "c", "sin": "s"}})",
      "c");
  const PlannedCase pq = plan_case(
      qk, {{"dq_out", {7, 4, 8}}, {"dk_out", {7, 2, 8}}, {"cos", {7, 4}}, {"sin", {7, 4}}});
  EXPECT_EQ(std::get<RopeQkPlan>(pq.plan).k.heads(), 2);
  EXPECT_EQ(pq.outputs.at("dq"), (Shape{7, 4, 8}));
  EXPECT_EQ(pq.outputs.at("dk"), (Shape{7, 2, 8}));
  e = plan_error(R"({"op": "rope_qk", "attrs": {"layout": "thd"},
                     "inputs": {"q": "q.npy", "k": "k.npy", "cos": "c", "sin": "s"}})",
                 {{"q", {7, 4, 8}}, {"k", {6, 2, 8}}, {"cos", {7, 4}}, {"sin", {7, 4}}});
  EXPECT_EQ(e.file(), "k.npy");
  EXPECT_EQ(e.field(), "k.shape");
}

TEST(CaseRun, PositionsReachTheBackendExactly) {
  Case c;
  c.spec = parse_case_json(
      R"({"op": "rope", "attrs": {"head_dim": 2},
          "inputs": {"x": "x.npy", "cos": "c.npy", "sin": "s.npy", "positions": "p.npy"}})",
      "c");
  c.inputs["x"] = {"x.npy", {{2, 2}, NpyDtype::f4, {1, 2, 3, 4}}};
  c.inputs["cos"] = {"c.npy", {{3, 1}, NpyDtype::f4, {1, 0, -1}}};
  c.inputs["sin"] = {"s.npy", {{3, 1}, NpyDtype::f4, {0, 1, 0}}};
  // 2^40 + 2 reads as 2^40 through float32; the exact value must arrive.
  const std::int64_t big = (std::int64_t{1} << 40) + 2;
  c.inputs["positions"] = {"p.npy", {{2}, NpyDtype::i8, {0x1p40f, 0}, {big, 0}}};
  c.planned =
      plan_case(c.spec, {{"x", {2, 2}}, {"cos", {3, 1}}, {"sin", {3, 1}}, {"positions", {2}}});
  Backend recording;
  recording.name = "recording";
  std::vector<std::int64_t> seen;
  recording.rope_forward = [&](const RopePlan&, std::span<const float>, const RopeTables<float>& t,
                               std::span<float>) {
    for (std::size_t i = 0; i < t.positions.size(); ++i) seen.push_back(t.positions[i]);
  };
  run_case(c, recording);
  EXPECT_EQ(seen, (std::vector<std::int64_t>{big, 0}));
}

TEST(CaseLoad, PositionsOutOfRangeNameTheirFileBeforeAnyBackendRuns) {
  try {
    load_case(std::string(TANDEM_CASES_DIR) + "/bad/rope_positions_out_of_range");
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_EQ(e.file(), "positions.npy");
    EXPECT_EQ(e.field(), "inputs.positions");
    EXPECT_EQ(e.detail(),
              "positions[3] = 5 must be in [0, max_position = 5) (the rows of cos and sin)");
  }
}

TEST(Compare, AppliesAtolPlusRtolTimesExpected) {
  const Tolerance tol{0.1, 0.01};
  // |got - exp| <= 0.01 + 0.1*|exp|: 10.0 vs 11.0 passes at the edge (1.0 <= 1.01).
  Comparison c = compare({11.0f, 0.0f}, {10.0f, 0.0f}, tol);
  EXPECT_TRUE(c.pass());
  EXPECT_NEAR(c.max_abs, 1.0, 1e-6);
  EXPECT_NEAR(c.max_rel, 0.1, 1e-6);  // elements with exp == 0 do not enter max_rel
  c = compare({11.2f, 0.02f}, {10.0f, 0.0f}, tol);
  EXPECT_FALSE(c.pass());
  EXPECT_EQ(c.mismatches, 2);
  EXPECT_EQ(c.count, 2);
  EXPECT_EQ(c.worst, 0);  // excess 0.19 beats 0.01
}

TEST(Compare, NonFiniteValuesMatchOnlyThemselves) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const Tolerance loose{1.0, 1.0};
  EXPECT_TRUE(compare({nan, inf, -inf}, {nan, inf, -inf}, loose).pass());
  EXPECT_FALSE(compare({1.0f}, {nan}, loose).pass());
  EXPECT_FALSE(compare({nan}, {1.0f}, loose).pass());
  EXPECT_FALSE(compare({-inf}, {inf}, loose).pass());
  EXPECT_FALSE(compare({1e30f}, {inf}, loose).pass());  // atol + rtol*inf must not excuse it
  EXPECT_FALSE(compare({inf}, {1e30f}, loose).pass());
  const Comparison c = compare({0.0f, 5.0f}, {0.0f, inf}, loose);
  EXPECT_EQ(c.worst, 1);
  EXPECT_TRUE(std::isinf(c.max_abs));
}

TEST(Compare, IndexStringIsCOrder) {
  EXPECT_EQ(index_string({2, 3, 4}, 0), "[0, 0, 0]");
  EXPECT_EQ(index_string({2, 3, 4}, 23), "[1, 2, 3]");
  EXPECT_EQ(index_string({2, 3, 4}, 13), "[1, 0, 1]");
}

TEST(CaseLoad, ReadsTheExamples) {
  const Case c = load_case(std::string(TANDEM_CASES_DIR) + "/examples/attention_gqa_causal");
  EXPECT_EQ(c.spec.op, Op::attention);
  EXPECT_EQ(c.inputs.at("q").array.shape, (Shape{1, 6, 4, 8}));
  EXPECT_EQ(c.expected.at("out").array.shape, c.planned.outputs.at("out"));
  const auto& plan = std::get<AttentionPlan>(c.planned.plan);
  EXPECT_EQ(plan.Hkv, 2);
  EXPECT_EQ(plan.mask, MaskKind::causal);
}

TEST(CaseLoad, IndexInputsAreIntegersCheckedByTheLibrary) {
  const std::string formats = std::string(TANDEM_CASES_DIR) + "/formats/";
  for (const char* name : {"features_varlen_int32", "features_varlen_int64"}) {
    const Case c = load_case(formats + name);
    EXPECT_EQ(std::get<AttentionPlan>(c.planned.plan).num_seqs, 2) << name;
    EXPECT_EQ(c.inputs.at("cu_seqlens_q").array.integers, (std::vector<std::int64_t>{0, 2, 5}));
  }
  const std::string bad = std::string(TANDEM_CASES_DIR) + "/bad/";
  try {
    load_case(bad + "cu_seqlens_q_not_from_zero");
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_EQ(e.file(), "cu_seqlens_q.npy");
    EXPECT_EQ(e.field(), "inputs.cu_seqlens_q");
  }
  try {
    load_case(bad + "cu_seqlens_float");
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_NE(std::string(e.what()).find("index inputs are <i4 or <i8"), std::string::npos);
  }
}

TEST(CaseLoad, MissingDirectoryAndFiles) {
  try {
    load_case("/nonexistent/case");
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_EQ(e.case_name(), "/nonexistent/case");
  }
}

TEST(CaseRun, CallsTheBackendAndReportsMissingEntryPoints) {
  Case c;
  c.spec = parse_case_json(R"({"op": "swiglu", "inputs": {"x": "x.npy"}})", "c");
  c.inputs["x"] = {"x.npy", {{2, 4}, NpyDtype::f4, {1, 2, 3, 4, 5, 6, 7, 8}}};
  c.planned = plan_case(c.spec, {{"x", {2, 4}}});
  Backend fake;
  fake.name = "fake";
  fake.swiglu_forward = [](const SwigluPlan& plan, std::span<const float> x, std::span<float> out) {
    // Not SwiGLU: g + u, enough to see which elements arrive where.
    for (std::int64_t r = 0; r < plan.rows; ++r) {
      for (std::int64_t i = 0; i < plan.n; ++i) {
        out[r * plan.n + i] = x[r * 2 * plan.n + i] + x[r * 2 * plan.n + plan.n + i];
      }
    }
  };
  const auto out = run_case(c, fake);
  EXPECT_EQ(out.at("out"), (std::vector<float>{4, 6, 12, 14}));

  Backend empty;
  empty.name = "empty";
  try {
    run_case(c, empty);
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_NE(std::string(e.what()).find("does not offer swiglu_forward for dtype f32"),
              std::string::npos);
  }
  Backend throwing;
  throwing.name = "strict";
  throwing.swiglu_forward = [](const SwigluPlan&, std::span<const float>, std::span<float> y) {
    require_size(y.size(), 99, "out");
  };
  try {
    run_case(c, throwing);
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "out.size()");
    EXPECT_NE(std::string(e.what()).find("rejected the call"), std::string::npos);
  }
}

// ---- storage types (SPEC §9.4, §10) ----------------------------------------------

TEST(CaseStorage, ParsesDtypeRoundingAndKvCache) {
  const CaseSpec spec = parse_case_json(
      R"({"op": "attention", "dtype": "bf16", "rounding": "ggml",
          "attrs": {"num_heads": 2, "kv_cache": "e4m3"},
          "inputs": {"q": "q", "k": "k", "v": "v", "k_scale": "a", "v_scale": "b"}})",
      "c");
  EXPECT_EQ(spec.dtype, DType::bf16);
  EXPECT_EQ(spec.rounding, kRoundingGgml);
  EXPECT_EQ(spec.kv_cache, KvCache::e4m3);
  const CaseSpec plain = parse_case_json(kAttention, "c");
  EXPECT_EQ(plain.dtype, DType::f32);
  EXPECT_EQ(plain.rounding, kRoundingPytorch);
  EXPECT_EQ(error_of(R"({"op": "swiglu", "dtype": "bf8", "inputs": {"x": "x"}})").field(), "dtype");
  EXPECT_EQ(error_of(R"({"op": "rope", "rounding": "exact",
                         "inputs": {"x": "x", "cos": "c", "sin": "s"}})")
                .field(),
            "rounding");
}

TEST(CaseStorage, PlanCarriesTheProfileAndTheCache) {
  const CaseSpec spec = parse_case_json(
      R"({"op": "attention", "dtype": "f16", "rounding": "exact",
          "attrs": {"num_heads": 2, "kv_cache": "int8"},
          "inputs": {"q": "q", "k": "k", "v": "v", "k_scale": "a", "v_scale": "b"}})",
      "c");
  const auto pc = plan_case(spec, {{"q", {1, 3, 2, 8}},
                                   {"k", {1, 5, 1, 8}},
                                   {"v", {1, 5, 1, 8}},
                                   {"k_scale", {1, 5, 1}},
                                   {"v_scale", {1, 5, 1}}});
  const auto& plan = std::get<AttentionPlan>(pc.plan);
  EXPECT_EQ(plan.rounding, kRoundingExact);
  EXPECT_EQ(plan.kv_cache, KvCache::int8);
  EXPECT_EQ(plan.kv_scale_size(), 5);
}

TEST(CaseStorage, Bf16CaseReadsItsBitsAndRunsAtBf16) {
  const Case c = load_case(std::string(TANDEM_CASES_DIR) + "/lowp/swiglu_bf16");
  EXPECT_EQ(c.spec.dtype, DType::bf16);
  // The bits became their values: every one is a bfloat16.
  for (float x : c.inputs.at("x").array.values) {
    EXPECT_EQ(static_cast<float>(static_cast<double>(bfloat16(static_cast<double>(x)))), x);
  }
  Backend fake;
  fake.name = "fake";
  std::vector<double> seen;
  fake.bf16.swiglu_forward = [&](const SwigluPlan& plan, std::span<const bfloat16> x,
                                 std::span<bfloat16> out) {
    for (const bfloat16& v : x) seen.push_back(static_cast<double>(v));
    for (std::int64_t i = 0; i < plan.rows * plan.n; ++i) out[i] = bfloat16(0.5 * i);
  };
  const auto out = run_case(c, fake);
  ASSERT_EQ(seen.size(), c.inputs.at("x").array.values.size());
  EXPECT_EQ(seen[3], c.inputs.at("x").array.values[3]);
  EXPECT_EQ(out.at("out")[5], 2.5f);
  // The float32 entry point is not the bf16 one.
  Backend f32_only;
  f32_only.name = "f32";
  f32_only.swiglu_forward = [](const SwigluPlan&, std::span<const float>, std::span<float>) {};
  try {
    run_case(c, f32_only);
    FAIL();
  } catch (const NotOffered& e) {
    EXPECT_NE(std::string(e.what()).find("does not offer swiglu_forward for dtype bf16"),
              std::string::npos);
  }
}

TEST(CaseStorage, ToleranceIsDerivedPerDtype) {
  const Case bf = load_case(std::string(TANDEM_CASES_DIR) + "/lowp/swiglu_bf16");
  EXPECT_EQ(bf.spec.tolerance.rtol, 3.0 / 256);  // 3 u, u = 2^-8 (SPEC §9.5)
  const Case h = load_case(std::string(TANDEM_CASES_DIR) + "/lowp/attention_f16");
  double vmax = 0;
  for (float x : h.inputs.at("v").array.values) vmax = std::max(vmax, std::fabs(double(x)));
  EXPECT_EQ(h.spec.tolerance.rtol, 2.0 / 2048);
  EXPECT_DOUBLE_EQ(h.spec.tolerance.atol, 2.0 / 2048 * vmax + 2 * std::ldexp(1.0, -25) + 2e-5);
}

// ---- FlexAttention cases (SPEC §9.7) ----------------------------------------

/// A flex case: score_mod where(kv_idx <= q_idx, score + bias[h, q_idx - kv_idx + 3], -inf)
/// capturing a real bias [4, 7], mask_mod doc[q_idx] == doc[kv_idx] capturing
/// integer ids [4] in [0, 1].
std::string flex_json(const std::string& op, const std::string& extra_inputs = "",
                      const std::string& extra = "") {
  return R"({"op": ")" + op + R"(", "attrs": {
    "score_mod": {"name": "rel", "tensors": [["bias", [4, 7], "real", 0, 0]],
      "nodes": [["score", [], "real", 0.0, 0, -1, []], ["h", [], "integer", 0.0, 0, -1, []],
                ["q_idx", [], "integer", 0.0, 0, -1, []], ["kv_idx", [], "integer", 0.0, 0, -1, []],
                ["sub", [2, 3], "real", 0.0, 0, -1, []],
                ["constant", [], "integer", 0.0, 3, -1, []],
                ["add", [4, 5], "real", 0.0, 0, -1, []],
                ["load", [], "real", 0.0, 0, 0, [1, 6]],
                ["add", [0, 7], "real", 0.0, 0, -1, []],
                ["le", [3, 2], "real", 0.0, 0, -1, []],
                ["constant", [], "real", "-inf", 0, -1, []],
                ["where", [9, 8, 10], "real", 0.0, 0, -1, []]], "result": 11},
    "mask_mod": {"tensors": [["doc", [4], "integer", 0, 1]],
      "nodes": [["q_idx", [], "integer", 0.0, 0, -1, []], ["kv_idx", [], "integer", 0.0, 0, -1, []],
                ["load", [], "integer", 0.0, 0, 0, [0]], ["load", [], "integer", 0.0, 0, 0, [1]],
                ["eq", [2, 3], "real", 0.0, 0, -1, []]], "result": 4})" +
         extra + R"(},
  "inputs": {"q": "q.npy", "k": "k.npy", "v": "v.npy", "bias": "b.npy", "doc": "d.npy")" +
         extra_inputs + "}}";
}

TEST(FlexCase, NodeListsBuildThePrograms) {
  const CaseSpec spec = parse_case_json(flex_json("flex_attention"), "c");
  const ModProgram& s = spec.flex.score_mod;
  ASSERT_EQ(s.nodes().size(), 12u);
  EXPECT_EQ(s.node(s.result()).op, ModOp::where);
  EXPECT_EQ(s.node(10).value, -std::numeric_limits<double>::infinity());  // "-inf"
  EXPECT_EQ(s.render(s.result()),
            "where((kv_idx <= q_idx), (score + bias[h, ((q_idx - kv_idx) + 3)]), -inf)");
  const ModProgram& m = spec.flex.mask_mod;
  EXPECT_EQ(m.node(m.result()).type, ModType::boolean);
  ASSERT_EQ(m.tensors().size(), 1u);
  EXPECT_EQ(m.tensors()[0].type, ModType::integer);
  EXPECT_EQ(m.tensors()[0].hi, 1);
  // The backward's outputs include the real tensor's gradient, not the integer one's.
  EXPECT_NO_THROW(parse_case_json(
      flex_json("flex_attention_backward", R"(, "dout": "o.npy"}, "expected": {"dbias": "x.npy")"),
      "c"));
  const auto e = error_of(
      flex_json("flex_attention_backward", R"(, "dout": "o.npy"}, "expected": {"ddoc": "x.npy")"));
  EXPECT_EQ(e.field(), "expected.ddoc");
}

TEST(FlexCase, ErrorsNameTheNodeAndTheInput) {
  std::string later = flex_json("flex_attention");
  later.replace(later.find(R"(["sub", [2, 3])"), 14, R"(["sub", [2, 7])");
  EXPECT_EQ(error_of(later).field(), "attrs.score_mod.nodes[4][1][1]");
  std::string typed = flex_json("flex_attention");
  typed.replace(typed.find(R"(["eq", [2, 3])"), 13, R"(["logical_and", [2, 3])");
  const auto t = error_of(typed);
  EXPECT_EQ(t.field(), "attrs.mask_mod.nodes[4]");
  EXPECT_NE(t.detail().find("logical_and"), std::string::npos) << t.detail();
  std::string no_bias = flex_json("flex_attention");
  no_bias.replace(no_bias.find(R"(, "bias": "b.npy")"), 17, "");
  EXPECT_EQ(error_of(no_bias).field(), "inputs.bias");
  std::string named_q = flex_json("flex_attention");
  named_q.replace(named_q.find(R"("doc", [4])"), 10, R"("q", [4])");
  named_q.replace(named_q.find(R"(, "doc": "d.npy")"), 16, "");
  EXPECT_EQ(error_of(named_q).field(), "attrs.mask_mod.tensors");
  EXPECT_EQ(error_of(flex_json("flex_attention", "", R"(, "block_size": 2)")).field(),
            "attrs.block_size");
  EXPECT_EQ(error_of(flex_json("flex_attention", R"(, "kv_indices": "i.npy")")).field(),
            "inputs.kv_num_blocks");
}

TEST(FlexCase, PlanTakesGqaAndTheBlockMaskFromShapes) {
  const std::map<std::string, Shape> shapes = {{"q", {2, 4, 4, 8}}, {"k", {2, 2, 4, 8}},
                                               {"v", {2, 2, 4, 6}}, {"bias", {4, 7}},
                                               {"doc", {4}},        {"dout", {2, 4, 4, 6}}};
  const CaseSpec fwd = parse_case_json(flex_json("flex_attention"), "c");
  const PlannedCase pc = plan_case(fwd, shapes);
  const auto& plan = std::get<FlexPlan>(pc.plan);
  EXPECT_EQ(plan.group(), 2);
  EXPECT_EQ(pc.outputs.at("out"), (Shape{2, 4, 4, 6}));
  EXPECT_EQ(pc.outputs.at("lse"), (Shape{2, 4, 4}));
  const CaseSpec bwd =
      parse_case_json(flex_json("flex_attention_backward", R"(, "dout": "o.npy")"), "c");
  const PlannedCase bpc = plan_case(bwd, shapes);
  EXPECT_EQ(bpc.outputs.at("dbias"), (Shape{4, 7}));
  // The bias is declared [4, 7]; a file of another shape is named.
  auto wrong = shapes;
  wrong["bias"] = {4, 8};
  const auto e = plan_error(flex_json("flex_attention"), wrong);
  EXPECT_EQ(e.file(), "b.npy");
  EXPECT_EQ(e.field(), "bias.shape");
  // A block mask of blocks of 2: nQ = 2; counts of [1, 1, 3] are named.
  auto masked = shapes;
  masked["kv_num_blocks"] = {1, 1, 2};
  masked["kv_indices"] = {1, 1, 2, 2};
  const std::string json =
      flex_json("flex_attention", R"(, "kv_num_blocks": "n.npy", "kv_indices": "i.npy")",
                R"(, "block_size": [2, 2])");
  const PlannedCase mpc = plan_case(parse_case_json(json, "c"), masked);
  EXPECT_EQ(std::get<FlexPlan>(mpc.plan).params().block_mask->width, 2);
  masked["kv_num_blocks"] = {1, 1, 3};
  masked["kv_indices"] = {1, 1, 3, 2};
  EXPECT_EQ(plan_error(json, masked).field(), "kv_num_blocks.shape");
  // H' must be 1 or H: the plan's error names the counts' file.
  masked["kv_num_blocks"] = {1, 3, 2};
  masked["kv_indices"] = {1, 3, 2, 2};
  EXPECT_EQ(plan_error(json, masked).file(), "n.npy");
}

TEST(FlexCase, ToleranceIsDerivedForFloat32Too) {
  const Case c = load_case(std::string(TANDEM_CASES_DIR) + "/examples/flex_softcap");
  double vmax = 0;
  for (float x : c.inputs.at("v").array.values) vmax = std::max(vmax, std::fabs(double(x)));
  const double u = std::ldexp(1.0, -24);  // the f32 rounding of o (SPEC §9.5, §9.7)
  EXPECT_EQ(c.spec.tolerance.rtol, 2 * u);
  EXPECT_DOUBLE_EQ(c.spec.tolerance.atol, 2 * u * vmax + 2e-5);
  EXPECT_EQ(output_names(c), (std::vector<std::string>{"out", "lse"}));
}

TEST(CaseStorage, QuantizedCaseRunsTheQuantizedEntryPoint) {
  const Case c = load_case(std::string(TANDEM_CASES_DIR) + "/lowp/attention_int8_cache_f32");
  Backend fake;
  fake.name = "fake";
  std::size_t codes = 0, scales = 0;
  fake.attention_forward_quantized = [&](const AttentionPlan& plan,
                                         const AttentionInputs<float>& in, const QuantizedKv& kv,
                                         std::span<float> out) {
    check_inputs(plan, in, kv);
    codes = kv.k.size();
    scales = kv.k_scale.size();
    std::fill(out.begin(), out.end(), 1.0f);
  };
  const auto out = run_case(c, fake);
  EXPECT_EQ(codes, c.inputs.at("k").array.integers.size());
  EXPECT_EQ(scales, c.inputs.at("k_scale").array.values.size());
  EXPECT_EQ(out.at("out").size(), c.expected.at("out").array.values.size());
}

}  // namespace
}  // namespace tandem::tool
