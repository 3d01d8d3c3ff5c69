// normjit kernel rmsnorm.fwd_infer.f16.w_f16.n7.cfg_t8_r32_v1_reg
// Generated from templates/norm_fwd.cu.in: parameter binding only; the logic is in norm_fwd.cuh.
#include "normjit/norm_fwd.cuh"
#include "normjit/epilogue_none.cuh"

namespace {
struct Cfg {
  using XT = normjit::f16;  // the rows as normalized (f32 for an fp32 residual stream)
  using YT = normjit::f16;  // x as given, y, dy, dx
  using WT = normjit::f16;
  using Epilogue = normjit::EpilogueNone;
  using Prologue = normjit::PrologueNone;
  static constexpr normjit::NormKind kNorm = normjit::NormKind::kRMSNorm;
  static constexpr bool kPerGroupWeights = false;
  static constexpr bool kTraining = false;
  static constexpr bool kHasBias = false;
  static constexpr bool kZeroCenteredGamma = false;  // the scale is 1 + gamma
  static constexpr int kN = 7;
  static constexpr int kVec = 1;
  static constexpr int kThreadsPerRow = 8;
  static constexpr int kRowsPerCta = 32;
  static constexpr int kCluster = 1;
  static constexpr int kStages = 2;  // row buffers of a pipelined row
  static constexpr bool kBulkCopy = false;  // pipelined rows filled by cp.async.bulk
  static constexpr normjit::RowCache kCache = normjit::RowCache::kRegisters;
};
}  // namespace

extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(256)
normjit_rmsnorm_fwd_infer_f16_w_f16_n7_cfg_t8_r32_v1_reg(const normjit::NormParams params) {
  normjit::norm_fwd<Cfg>(params);
}
