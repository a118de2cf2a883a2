// SPDX-License-Identifier: Apache-2.0
// The suite rejects every broken fixture: for each planted bug, every
// property listed for it must fail (RapidCheck, fixed seed, no shrinking),
// and every property of the suite is listed for at least one bug, so no
// property is unable to fail. Set TANDEM_PROPS_MATRIX=1 to print which
// property rejects which fixture, for all pairs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <set>

#include "support.hpp"

namespace {

using tandem::props::broken::Bug;

struct Expectation {
  Bug bug;
  std::vector<std::string> caught_by;
};

const std::vector<Expectation>& expectations() {
  // Measured: the properties that reject each fixture (TANDEM_PROPS_MATRIX=1, three seeds).
  static const std::vector<Expectation> table = {
      {Bug::flex_score_unscaled,
       {"agree_flex_forward", "agree_flex_backward", "agree_flex_native_forward",
        "agree_flex_native_backward", "agree_flex_stored"}},
      {Bug::flex_thread_dependent, {"flex_threads_bitwise"}},
      {Bug::flex_block_mask_ignored, {"agree_flex_native_forward", "agree_flex_native_backward"}},
      {Bug::flex_nonfinite_rows_zeroed, {"agree_flex_nonfinite"}},
      {Bug::rope_table_stride_half_nrot,
       {"agree_rope", "agree_rope_qk", "rope_backward_inverts_forward", "rope_table_junk_ignored",
        "rope_token_table_equals_position_table", "rope_positions_equal_token_table",
        "rope_relative_position_and_norm", "attention_block_equals_composition",
        "accuracy_within_2x_single_precision"}},
      {Bug::rope_rank4_as_bshd,
       {"agree_rope", "agree_rope_qk", "rope_token_table_equals_position_table",
        "rope_layouts_equivalent", "rope_rank4_equals_per_head", "rope_relative_position_and_norm",
        "attention_block_equals_composition", "accuracy_within_2x_single_precision"}},
      {Bug::attn_batch_offset_units,
       {"agree_attention_forward",
        "agree_attention_backward",
        "agree_attention_saved_state",
        "agree_attention_backward_separate",
        "attention_gradient_complex_step",
        "attention_layouts_equivalent",
        "attention_strided_rows_equal_contiguous",
        "gqa_equals_repeated_mha",
        "key_permutation_invariance",
        "masked_keys_never_read",
        "fully_masked_rows_zero",
        "agree_attention_features_forward",
        "agree_attention_features_backward",
        "attention_features_gradient_complex_step",
        "sink_equals_extra_key",
        "paged_equals_gathered_cache",
        "paged_unused_blocks_never_read",
        "attention_block_equals_composition",
        "accuracy_within_2x_single_precision",
        "attention_plan_addressing_follows_spec",
        "attention_rank4_layout_by_num_heads",
        "attention_index_inputs_at_their_bounds",
        "attention_plan_params_at_their_bounds"}},
      {Bug::rope_backward_other_row,
       {"agree_rope", "agree_rope_qk", "rope_adjoint", "rope_positions_equal_token_table",
        "rope_layouts_equivalent", "accuracy_within_2x_single_precision"}},
      {Bug::gqa_mod,
       {"agree_attention_forward", "agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "gqa_equals_repeated_mha", "agree_attention_features_forward",
        "agree_attention_features_backward", "attention_features_gradient_complex_step",
        "accuracy_within_2x_single_precision"}},
      {Bug::causal_offset_dropped,
       {"agree_attention_forward", "agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "bias_upper_inf_equals_causal", "masked_keys_never_read",
        "agree_attention_features_forward", "agree_attention_features_backward",
        "attention_features_gradient_complex_step", "sink_equals_extra_key", "alibi_equals_bias",
        "accuracy_within_2x_single_precision"}},
      {Bug::window_off_by_one,
       {"agree_attention_forward", "agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "wide_window_equals_causal", "agree_attention_features_forward",
        "agree_attention_features_backward", "attention_features_gradient_complex_step",
        "sink_equals_extra_key", "alibi_equals_bias", "accuracy_within_2x_single_precision"}},
      {Bug::softcap_missing_backward,
       {"agree_attention_backward", "agree_attention_saved_state",
        "attention_one_call_backward_equals_separate", "attention_gradient_complex_step",
        "agree_attention_features_backward", "attention_features_gradient_complex_step",
        "accuracy_within_2x_single_precision"}},
      {Bug::masked_row_nan,
       {"agree_attention_forward", "agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "fully_masked_rows_zero", "agree_attention_features_forward",
        "agree_attention_features_backward", "attention_features_gradient_complex_step",
        "sink_equals_extra_key", "varlen_equals_per_sequence", "paged_equals_gathered_cache",
        "attention_block_equals_composition", "accuracy_within_2x_single_precision"}},
      {Bug::scale_ignored_backward,
       {"agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "agree_attention_features_backward", "attention_features_gradient_complex_step",
        "accuracy_within_2x_single_precision"}},
      {Bug::write_past_output, {"attention_features_memory", "memory_guards_and_inputs_untouched"}},
      {Bug::rope_src_stride_ignored,
       {"agree_rope", "agree_rope_qk", "rope_adjoint", "rope_backward_inverts_forward",
        "rope_strided_rows_equal_contiguous", "rope_relative_position_and_norm",
        "rope_neox_equals_permuted_gptj", "attention_block_equals_composition",
        "accuracy_within_2x_single_precision", "rope_plan_addressing_follows_spec",
        "rope_inputs_at_their_bounds"}},
      {Bug::token_rows_transposed,
       {"agree_rope", "agree_rope_qk", "rope_token_table_equals_position_table",
        "rope_positions_equal_token_table", "rope_layouts_equivalent",
        "rope_relative_position_and_norm", "accuracy_within_2x_single_precision"}},
      {Bug::rope_sin_sign,
       {"agree_rope", "agree_rope_qk", "rope_adjoint", "rope_backward_inverts_forward",
        "rope_relative_position_and_norm", "rope_neox_equals_permuted_gptj",
        "attention_block_equals_composition", "accuracy_within_2x_single_precision"}},
      {Bug::gptj_angle_negated,
       {"agree_rope", "agree_rope_qk", "rope_neox_equals_permuted_gptj",
        "accuracy_within_2x_single_precision"}},
      {Bug::axial_backward_same_angle,
       {"agree_axial_rope", "axial_rope_adjoint", "rope_backward_inverts_forward",
        "accuracy_within_2x_single_precision"}},
      {Bug::axial_repeat_ignored, {"agree_axial_rope", "accuracy_within_2x_single_precision"}},
      {Bug::keep_row_batch0,
       {"agree_attention_forward", "agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "key_padding_equals_bias", "masked_keys_never_read", "fully_masked_rows_zero",
        "agree_attention_features_forward", "agree_attention_features_backward",
        "attention_features_gradient_complex_step", "sink_equals_extra_key", "alibi_equals_bias",
        "attention_block_equals_composition", "accuracy_within_2x_single_precision"}},
      {Bug::softcap_tanh_unscaled,
       {"agree_attention_forward", "agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "huge_softcap_equals_none", "agree_attention_features_forward",
        "agree_attention_features_backward", "attention_features_gradient_complex_step",
        "accuracy_within_2x_single_precision"}},
      {Bug::key_tail_dropped,
       {"agree_attention_forward", "agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "key_permutation_invariance", "agree_attention_features_forward",
        "agree_attention_features_backward", "attention_features_gradient_complex_step",
        "sink_equals_extra_key", "attention_block_equals_composition",
        "accuracy_within_2x_single_precision"}},
      {Bug::masked_times_value, {"masked_keys_never_read"}},
      {Bug::swiglu_backward_short,
       {"agree_swiglu", "swiglu_gradient_complex_step", "accuracy_within_2x_single_precision"}},
      {Bug::block_out_bias_dropped,
       {"agree_attention_block", "attention_block_equals_composition"}},
      {Bug::dbias_broadcast_unsummed,
       {"agree_attention_dbias", "attention_dbias_complex_step", "dbias_broadcast_equals_summed"}},
      {Bug::dbias_is_p, {"agree_attention_dbias", "attention_dbias_complex_step"}},
      {Bug::dbias_capped, {"agree_attention_dbias", "attention_dbias_complex_step"}},
      {Bug::dbias_sum_thread_dependent, {"attention_dbias_deterministic"}},
      // batch invariance (SPEC §12): only the invariance properties see these
      {Bug::decode_dot_reversed, {"decode_equals_prefill"}},
      {Bug::blocks_ignore_key_origin, {"origin_invariant"}},
      {Bug::key_chunks_by_sequences,
       {"batch_invariant", "packed_equals_separate", "paged_equals_contiguous",
        "backward_batch_invariant"}},
      {Bug::thread_dependent_sum,
       {"attention_features_deterministic", "deterministic_across_calls_and_threads",
        "geometry_invariant"}},
      {Bug::coarse_exp,
       {"agree_attention_forward", "agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "agree_attention_features_forward", "agree_attention_features_backward",
        "attention_features_gradient_complex_step", "accuracy_within_2x_single_precision"}},
      {Bug::v_row_stride_ignored,
       {"agree_attention_forward", "agree_attention_backward", "agree_attention_saved_state",
        "agree_attention_backward_separate", "attention_gradient_complex_step",
        "attention_strided_rows_equal_contiguous", "gqa_equals_repeated_mha",
        "key_permutation_invariance", "fully_masked_rows_zero", "agree_attention_features_forward",
        "agree_attention_features_backward", "attention_features_gradient_complex_step",
        "sink_equals_extra_key", "varlen_equals_per_sequence", "varlen_padding_never_read",
        "paged_equals_gathered_cache", "attention_block_equals_composition",
        "accuracy_within_2x_single_precision"}},
      {Bug::saved_lse_without_log,
       {"agree_attention_saved_state", "agree_attention_features_forward",
        "agree_attention_features_backward"}},
      {Bug::rope_positions_per_batch_row,
       {"agree_rope", "agree_rope_qk", "rope_positions_equal_token_table",
        "rope_layouts_equivalent", "accuracy_within_2x_single_precision"}},
      {Bug::rope_bhsd_as_bshd,
       {"agree_rope", "agree_rope_qk", "rope_layouts_equivalent", "rope_rank4_equals_per_head",
        "rope_relative_position_and_norm", "accuracy_within_2x_single_precision",
        "rope_plan_addressing_follows_spec", "rope_rank4_layout_by_num_heads",
        "rope_inputs_at_their_bounds"}},
      {Bug::rope_qk_k_rows_by_q_heads, {"agree_rope_qk"}},
      {Bug::rope_positions_checked_late,
       {"rope_bad_positions_rejected", "rope_inputs_at_their_bounds"}},
      {Bug::sink_value_first_key,
       {"masked_keys_never_read", "agree_attention_features_forward",
        "agree_attention_features_backward", "sink_equals_extra_key"}},
      {Bug::dsink_sign_flipped,
       {"agree_attention_features_backward", "attention_features_gradient_complex_step"}},
      {Bug::sink_sum_thread_dependent, {"attention_features_deterministic"}},
      {Bug::alibi_without_abs,
       {"agree_attention_features_forward", "agree_attention_features_backward",
        "attention_features_gradient_complex_step", "alibi_equals_bias"}},
      {Bug::alibi_shift_flipped,
       {"agree_attention_features_forward", "agree_attention_features_backward",
        "attention_features_gradient_complex_step", "alibi_equals_bias"}},
      {Bug::varlen_global_alignment,
       {"agree_attention_features_forward", "agree_attention_features_backward",
        "attention_features_gradient_complex_step", "varlen_equals_per_sequence"}},
      {Bug::varlen_reads_across_boundary,
       {"agree_attention_features_forward", "agree_attention_features_backward",
        "attention_features_gradient_complex_step", "varlen_equals_per_sequence",
        "varlen_padding_never_read"}},
      {Bug::varlen_ignores_seqused,
       {"agree_attention_features_forward", "agree_attention_features_backward",
        "attention_features_gradient_complex_step", "varlen_equals_per_sequence",
        "varlen_padding_never_read"}},
      {Bug::paged_table_ignored,
       {"agree_attention_features_forward", "paged_equals_gathered_cache",
        "paged_unused_blocks_never_read", "paged_equals_contiguous"}},
      {Bug::paged_slot_off_by_one,
       {"agree_attention_features_forward", "paged_equals_gathered_cache",
        "paged_unused_blocks_never_read", "paged_equals_contiguous"}},
      {Bug::features_write_before_check,
       {"attention_features_invalid_rejected_before_writes",
        "attention_index_inputs_at_their_bounds"}},
      {Bug::dsinks_one_past, {"attention_features_memory"}},
      // low precision (SPEC §10): each bug against the properties of props_lowp.cpp
      {Bug::weights_rounded_twice, {"lowp_agree_attention_forward"}},
      {Bug::output_accumulated_in_t, {"lowp_agree_attention_forward"}},
      {Bug::weights_non_integer_max, {"lowp_agree_attention_forward"}},
      {Bug::weights_three_bits,
       {"lowp_agree_attention_forward", "lowp_error_within_2x_naive",
        "lowp_exact_profile_rounds_once", "lowp_agree_attention_quantized"}},
      {Bug::store_truncates,
       {"lowp_agree_attention_forward", "lowp_exact_profile_rounds_once", "lowp_agree_rope",
        "lowp_agree_axial_rope", "lowp_agree_swiglu"}},
      {Bug::quantize_truncates, {"lowp_quantize_kv_bitwise"}},
      {Bug::decode_drops_v_scale, {"lowp_agree_attention_quantized"}},
      {Bug::quantized_plan_unchecked, {"lowp_invalid_rejected_before_writes"}},
      {Bug::dv_weights_unrounded,
       {"lowp_agree_attention_backward", "lowp_agree_attention_features_backward"}},
      {Bug::sink_weight_rounded, {"lowp_agree_attention_features_forward"}},
      {Bug::exact_rounds_masked_rows,
       {"lowp_agree_attention_forward", "lowp_agree_attention_features_forward"}},
      {Bug::paged_blocks_reversed_bf16,
       {"lowp_agree_attention_features_forward", "lowp_agree_attention_features_quantized"}},
      {Bug::dsinks_accumulated_in_t, {"lowp_agree_attention_features_backward"}},
      {Bug::dbias_accumulated_in_t, {"lowp_agree_attention_backward_broadcast_bias"}},
      {Bug::block_qkv_unrounded, {"lowp_block_equals_composition"}},
  };
  return table;
}

void PrintTo(const Expectation& e, std::ostream* os) {
  *os << tandem::props::broken::to_string(e.bug);
}

/// Cases a property may take to reject a fixture.
constexpr int kFixtureCases = 300;

std::uint64_t seed_of(Bug bug, const std::string& prop) {
  return std::hash<std::string>{}(std::string(tandem::props::broken::to_string(bug)) + "/" + prop) &
         0xffffffffu;
}

class FixtureTest : public testing::TestWithParam<Expectation> {};

TEST_P(FixtureTest, RejectedByItsProperties) {
  const Expectation& e = GetParam();
  const tandem::props::Subject s = tandem::props::fixture_subject(e.bug);
  for (const std::string& name : e.caught_by) {
    const tandem::props::Property& p = tandem::props::property(name);
    const std::string failure =
        tandem::props::run_property(p, s, kFixtureCases, true, seed_of(e.bug, name));
    EXPECT_FALSE(failure.empty()) << name << " did not reject " << s.name << " in " << kFixtureCases
                                  << " cases";
  }
}

INSTANTIATE_TEST_SUITE_P(Broken, FixtureTest, testing::ValuesIn(expectations()),
                         [](const testing::TestParamInfo<Expectation>& param_info) {
                           return std::string(
                               tandem::props::broken::to_string(param_info.param.bug));
                         });

TEST(Fixtures, EveryBugHasAnExpectation) {
  std::set<Bug> listed;
  for (const Expectation& e : expectations()) listed.insert(e.bug);
  for (Bug b : tandem::props::broken::all_bugs()) {
    EXPECT_TRUE(listed.count(b)) << tandem::props::broken::to_string(b)
                                 << " is caught by no listed property";
  }
}

TEST(Fixtures, EveryPropertyRejectsSomeFixture) {
  std::set<std::string> catching;
  for (const Expectation& e : expectations())
    catching.insert(e.caught_by.begin(), e.caught_by.end());
  for (const tandem::props::Property& p : tandem::props::properties()) {
    EXPECT_TRUE(catching.count(p.name))
        << p.name << " rejects no fixture: it is not shown to be able to fail";
  }
}

TEST(Fixtures, BugFreeFixturePassesEveryProperty) {
  const tandem::props::Subject s = tandem::props::fixture_subject(Bug::none);
  for (const tandem::props::Property& p : tandem::props::properties()) {
    const std::string failure =
        tandem::props::run_property(p, s, 20, true, seed_of(Bug::none, p.name));
    EXPECT_TRUE(failure.empty()) << p.name << " rejects the bug-free fixture:\n" << failure;
  }
}

/// The full matrix with RapidCheck's own seed (RC_PARAMS), for the documentation:
/// TANDEM_PROPS_MATRIX=1, or the rows of some bugs: TANDEM_PROPS_MATRIX=bug,bug.
TEST(Fixtures, Matrix) {
  const char* which = std::getenv("TANDEM_PROPS_MATRIX");
  if (which == nullptr) GTEST_SKIP() << "set TANDEM_PROPS_MATRIX=1";
  const std::string only = std::string(",") + which + ",";
  for (Bug b : tandem::props::broken::all_bugs()) {
    const std::string name = tandem::props::broken::to_string(b);
    if (only != ",1," && only.find("," + name + ",") == std::string::npos) continue;
    const tandem::props::Subject s = tandem::props::fixture_subject(b);
    std::cout << s.name << ":";
    for (const tandem::props::Property& p : tandem::props::properties()) {
      if (!tandem::props::run_property(p, s, 300, true).empty()) std::cout << " " << p.name;
    }
    std::cout << std::endl;
  }
}

}  // namespace
