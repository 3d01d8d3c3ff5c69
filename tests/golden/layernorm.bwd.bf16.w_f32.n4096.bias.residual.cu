// normjit kernel layernorm.bwd.bf16.w_f32.n4096.bias.residual.cfg_t256_r1_v8_tma3
// Generated from templates/norm_bwd.cu.in: parameter binding only; the logic is in norm_bwd.cuh.
#include "normjit/norm_bwd.cuh"
#include "normjit/epilogue_none.cuh"

namespace {
struct Cfg {
  using XT = normjit::bf16;  // the rows as normalized (f32 for an fp32 residual stream)
  using YT = normjit::bf16;  // x as given, y, dy, dx
  using WT = normjit::f32;
  using Epilogue = normjit::EpilogueNone;
  using Prologue = normjit::PrologueResidualAdd<normjit::bf16, false>;
  static constexpr normjit::NormKind kNorm = normjit::NormKind::kLayerNorm;
  static constexpr bool kPerGroupWeights = false;
  static constexpr bool kHasBias = true;
  static constexpr bool kZeroCenteredGamma = false;  // the scale is 1 + gamma
  static constexpr int kN = 4096;
  static constexpr int kVec = 8;
  static constexpr int kThreadsPerRow = 256;
  static constexpr int kRowsPerCta = 1;
  static constexpr int kCluster = 1;
  static constexpr int kStages = 3;  // row buffers of a pipelined row
  static constexpr bool kBulkCopy = true;  // pipelined rows filled by cp.async.bulk
  static constexpr normjit::RowCache kCache = normjit::RowCache::kSharedPipelined;
  static constexpr bool kDbetaShared = false;
  static constexpr bool kXhatFromY = false;  // memory_efficient: x is the forward's y
  static constexpr bool kBulkDhOut = true;  // dh_out bulk-copied beside x and dy
};
}  // namespace

#if 1
extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(256)
normjit_layernorm_bwd_bf16_w_f32_n4096_bias_residual_cfg_t256_r1_v8_tma3_fused(const normjit::NormParams params) {
  normjit::norm_bwd_fused<Cfg>(params);
}
#else
extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(256)
normjit_layernorm_bwd_bf16_w_f32_n4096_bias_residual_cfg_t256_r1_v8_tma3_rowsums(const normjit::NormParams params) {
  normjit::norm_bwd_rowsums<Cfg>(params);
}
extern "C" __global__ void __launch_bounds__(256)
normjit_layernorm_bwd_bf16_w_f32_n4096_bias_residual_cfg_t256_r1_v8_tma3_tiles(const normjit::NormParams params) {
  normjit::norm_bwd_tiles<Cfg>(params);
}
#endif
extern "C" __global__ void __launch_bounds__(1024)
normjit_layernorm_bwd_bf16_w_f32_n4096_bias_residual_cfg_t256_r1_v8_tma3_reduce(const normjit::NormParams params) {
  normjit::norm_bwd_reduce<Cfg>(params);
}
