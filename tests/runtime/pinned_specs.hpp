// Pinned block configurations, including ones the heuristic does not pick (forward clusters in
// registers, 16-CTA clusters): compiled by tests/runtime/test_compile.cpp's spill check and by
// scripts/sass_dump.cpp's default list.
#pragma once

namespace normjit::testing {

inline constexpr const char* kPinnedStrategySpecs[] = {
    "layernorm.fwd_train.bf16.w_bf16.n65536.bias.cfg_t1024_r1_v8_smem",
    "rmsnorm.fwd_train.bf16.w_f32.n65536.cfg_t512_r1_v8_smem",
    "layernorm.fwd_train.f32.w_f32.n32768.bias.relu_bitmask.cfg_t1024_r1_v4_smem",
    "adalayernorm.fwd_infer.f16.w_f32.n100000.bias.gelu.cfg_t1024_r1_v8_smem",
    "rmsnorm.fwd_train.bf16.w_bf16.n4097.cfg_t256_r1_v1_smem",
    "layernorm.fwd_train.bf16.w_f32.n32768.bias.cfg_t512_r1_v8_c2_reg",
    "rmsnorm.fwd_train.f16.w_f16.n65536.bias.relu_bitmask.cfg_t256_r1_v8_c8_reg",
    "layernorm.fwd_train.bf16.w_bf16.n262144.bias.cfg_t1024_r1_v8_c4_smem",
    "rmsnorm.fwd_train.f32.w_f32.n262144.cfg_t1024_r1_v4_c8_smem",
    "layernorm.fwd_train.bf16.w_bf16.n131072.bias.relu_bitmask.cfg_t512_r1_v8_c2_smem",
    "adalayernorm.fwd_train.f16.w_f32.n98304.bias.cfg_t768_r1_v8_c2_smem",
    "layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t512_r1_v8_smem",
    "layernorm.fwd_train.bf16.w_bf16.n65536.bias.cfg_t256_r1_v8_c4_tma",
    "rmsnorm.bwd.f32.w_f32.n4096.bias.gelu.cfg_t256_r1_v4_tma4",
    "layernorm.bwd.bf16.w_f32.n18432.bias.cfg_t576_r1_v8_smem",
    "adalayernorm.bwd.f16.w_f32.n12288.bias.relu_bitmask.cfg_t512_r1_v8_smem",
    "rmsnorm.bwd.f32.w_f32.n8192.bias.gelu.cfg_t512_r1_v4_smem",
    // 16-CTA (non-portable) clusters.
    "rmsnorm.bwd.f16.w_f16.n8192.cfg_t64_r1_v8_c16_smem",
    "layernorm.bwd.bf16.w_f32.n262144.bias.cfg_t1024_r1_v8_c16_tma",
    "rmsnorm.fwd_train.bf16.w_bf16.n65536.cfg_t512_r1_v8_c16_reg",
};

}  // namespace normjit::testing
