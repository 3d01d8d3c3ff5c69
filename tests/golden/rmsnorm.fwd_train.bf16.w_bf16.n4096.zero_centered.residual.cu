// normjit kernel rmsnorm.fwd_train.bf16.w_bf16.n4096.zero_centered.residual.cfg_t128_r1_v8_reg
// Generated from templates/norm_fwd.cu.in: parameter binding only; the logic is in norm_fwd.cuh.
#include "normjit/norm_fwd.cuh"
#include "normjit/epilogue_none.cuh"

namespace {
struct Cfg {
  using XT = normjit::bf16;  // the rows as normalized (f32 for an fp32 residual stream)
  using YT = normjit::bf16;  // x as given, y, dy, dx
  using WT = normjit::bf16;
  using Epilogue = normjit::EpilogueNone;
  using Prologue = normjit::PrologueResidualAdd<normjit::bf16, false>;
  static constexpr normjit::NormKind kNorm = normjit::NormKind::kRMSNorm;
  static constexpr bool kPerGroupWeights = false;
  static constexpr bool kTraining = true;
  static constexpr bool kHasBias = false;
  static constexpr bool kZeroCenteredGamma = true;  // the scale is 1 + gamma
  static constexpr int kN = 4096;
  static constexpr int kVec = 8;
  static constexpr int kThreadsPerRow = 128;
  static constexpr int kRowsPerCta = 1;
  static constexpr int kCluster = 1;
  static constexpr int kStages = 2;  // row buffers of a pipelined row
  static constexpr bool kBulkCopy = false;  // pipelined rows filled by cp.async.bulk
  static constexpr normjit::RowCache kCache = normjit::RowCache::kRegisters;
};
}  // namespace

extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(128)
normjit_rmsnorm_fwd_train_bf16_w_bf16_n4096_zero_centered_residual_cfg_t128_r1_v8_reg(const normjit::NormParams params) {
  normjit::norm_fwd<Cfg>(params);
}
