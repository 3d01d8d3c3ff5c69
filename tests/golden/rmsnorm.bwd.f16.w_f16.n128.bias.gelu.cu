// normjit kernel rmsnorm.bwd.f16.w_f16.n128.bias.gelu.cfg_t16_r16_v8_reg
// Generated from templates/norm_bwd.cu.in: parameter binding only; the logic is in norm_bwd.cuh.
#include "normjit/norm_bwd.cuh"
#include "normjit/epilogue_gelu.cuh"

namespace {
struct Cfg {
  using XT = normjit::f16;  // the rows as normalized (f32 for an fp32 residual stream)
  using YT = normjit::f16;  // x as given, y, dy, dx
  using WT = normjit::f16;
  using Epilogue = normjit::EpilogueGelu;
  using Prologue = normjit::PrologueNone;
  static constexpr normjit::NormKind kNorm = normjit::NormKind::kRMSNorm;
  static constexpr bool kPerGroupWeights = false;
  static constexpr bool kHasBias = true;
  static constexpr bool kZeroCenteredGamma = false;  // the scale is 1 + gamma
  static constexpr int kN = 128;
  static constexpr int kVec = 8;
  static constexpr int kThreadsPerRow = 16;
  static constexpr int kRowsPerCta = 16;
  static constexpr int kCluster = 1;
  static constexpr int kStages = 2;  // row buffers of a pipelined row
  static constexpr bool kBulkCopy = false;  // pipelined rows filled by cp.async.bulk
  static constexpr normjit::RowCache kCache = normjit::RowCache::kRegisters;
  static constexpr bool kDbetaShared = false;
  static constexpr bool kXhatFromY = false;  // memory_efficient: x is the forward's y
};
}  // namespace

#if 1
extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(256)
normjit_rmsnorm_bwd_f16_w_f16_n128_bias_gelu_cfg_t16_r16_v8_reg_fused(const normjit::NormParams params) {
  normjit::norm_bwd_fused<Cfg>(params);
}
#else
extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(256)
normjit_rmsnorm_bwd_f16_w_f16_n128_bias_gelu_cfg_t16_r16_v8_reg_rowsums(const normjit::NormParams params) {
  normjit::norm_bwd_rowsums<Cfg>(params);
}
extern "C" __global__ void __launch_bounds__(256)
normjit_rmsnorm_bwd_f16_w_f16_n128_bias_gelu_cfg_t16_r16_v8_reg_tiles(const normjit::NormParams params) {
  normjit::norm_bwd_tiles<Cfg>(params);
}
#endif
extern "C" __global__ void __launch_bounds__(1024)
normjit_rmsnorm_bwd_f16_w_f16_n128_bias_gelu_cfg_t16_r16_v8_reg_reduce(const normjit::NormParams params) {
  normjit::norm_bwd_reduce<Cfg>(params);
}
