// normjit kernel layernorm.fwd_train.f32.w_f32.n768.bias.relu_bitmask.cfg_t64_r1_v4_reg
// Generated from templates/norm_fwd.cu.in: parameter binding only; the logic is in norm_fwd.cuh.
#include "normjit/norm_fwd.cuh"
#include "normjit/epilogue_relu_bitmask.cuh"

namespace {
struct Cfg {
  using XT = normjit::f32;  // the rows as normalized (f32 for an fp32 residual stream)
  using YT = normjit::f32;  // x as given, y, dy, dx
  using WT = normjit::f32;
  using Epilogue = normjit::EpilogueReluBitmask;
  using Prologue = normjit::PrologueNone;
  static constexpr normjit::NormKind kNorm = normjit::NormKind::kLayerNorm;
  static constexpr bool kPerGroupWeights = false;
  static constexpr bool kTraining = true;
  static constexpr bool kHasBias = true;
  static constexpr bool kZeroCenteredGamma = false;  // the scale is 1 + gamma
  static constexpr int kN = 768;
  static constexpr int kVec = 4;
  static constexpr int kThreadsPerRow = 64;
  static constexpr int kRowsPerCta = 1;
  static constexpr int kCluster = 1;
  static constexpr int kStages = 2;  // row buffers of a pipelined row
  static constexpr bool kBulkCopy = false;  // pipelined rows filled by cp.async.bulk
  static constexpr normjit::RowCache kCache = normjit::RowCache::kRegisters;
};
}  // namespace

extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(64)
normjit_layernorm_fwd_train_f32_w_f32_n768_bias_relu_bitmask_cfg_t64_r1_v4_reg(const normjit::NormParams params) {
  normjit::norm_fwd<Cfg>(params);
}
