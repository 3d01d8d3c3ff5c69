// normjit kernel layernorm.bwd.bf16.w_f32.n65536.bias.cfg_t512_r1_v8_c8_tma
// Generated from templates/norm_bwd.cu.in: parameter binding only; the logic is in norm_bwd.cuh.
#include "normjit/norm_bwd.cuh"
#include "normjit/epilogue_none.cuh"

namespace {
struct Cfg {
  using XT = normjit::bf16;  // the rows as normalized (f32 for an fp32 residual stream)
  using YT = normjit::bf16;  // x as given, y, dy, dx
  using WT = normjit::f32;
  using Epilogue = normjit::EpilogueNone;
  using Prologue = normjit::PrologueNone;
  static constexpr normjit::NormKind kNorm = normjit::NormKind::kLayerNorm;
  static constexpr bool kPerGroupWeights = false;
  static constexpr bool kHasBias = true;
  static constexpr bool kZeroCenteredGamma = false;  // the scale is 1 + gamma
  static constexpr int kN = 65536;
  static constexpr int kVec = 8;
  static constexpr int kThreadsPerRow = 512;
  static constexpr int kRowsPerCta = 1;
  static constexpr int kCluster = 8;
  static constexpr int kStages = 2;  // row buffers of a pipelined row
  static constexpr bool kBulkCopy = true;  // pipelined rows filled by cp.async.bulk
  static constexpr normjit::RowCache kCache = normjit::RowCache::kSharedPipelined;
  static constexpr bool kDbetaShared = false;
  static constexpr bool kXhatFromY = false;  // memory_efficient: x is the forward's y
};
}  // namespace

#if 1
extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(512) __cluster_dims__(8, 1, 1)
normjit_layernorm_bwd_bf16_w_f32_n65536_bias_cfg_t512_r1_v8_c8_tma_fused(const normjit::NormParams params) {
  normjit::norm_bwd_fused<Cfg>(params);
}
#else
extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(512)
normjit_layernorm_bwd_bf16_w_f32_n65536_bias_cfg_t512_r1_v8_c8_tma_rowsums(const normjit::NormParams params) {
  normjit::norm_bwd_rowsums<Cfg>(params);
}
extern "C" __global__ void __launch_bounds__(256)
normjit_layernorm_bwd_bf16_w_f32_n65536_bias_cfg_t512_r1_v8_c8_tma_tiles(const normjit::NormParams params) {
  normjit::norm_bwd_tiles<Cfg>(params);
}
#endif
extern "C" __global__ void __launch_bounds__(1024)
normjit_layernorm_bwd_bf16_w_f32_n65536_bias_cfg_t512_r1_v8_c8_tma_reduce(const normjit::NormParams params) {
  normjit::norm_bwd_reduce<Cfg>(params);
}
