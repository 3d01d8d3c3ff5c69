// normjit kernel rmsnorm.fwd_infer.bf16.w_bf16.n4096.fp8_e4m3.cfg_t128_r1_v8_reg
// Generated from templates/norm_fwd.cu.in: parameter binding only; the logic is in norm_fwd.cuh.
#include "normjit/norm_fwd.cuh"
#include "normjit/epilogue_fp8.cuh"

namespace {
struct Cfg {
  using XT = normjit::bf16;  // the rows as normalized (f32 for an fp32 residual stream)
  using YT = normjit::bf16;  // x as given, y, dy, dx
  using WT = normjit::bf16;
  using Epilogue = normjit::EpilogueFp8<false>;
  using Prologue = normjit::PrologueNone;
  static constexpr normjit::NormKind kNorm = normjit::NormKind::kRMSNorm;
  static constexpr bool kPerGroupWeights = false;
  static constexpr bool kTraining = false;
  static constexpr bool kHasBias = false;
  static constexpr bool kZeroCenteredGamma = false;  // the scale is 1 + gamma
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

extern "C" __global__ void NORMJIT_CAPPED_LAUNCH_BOUNDS(128, 10)
normjit_rmsnorm_fwd_infer_bf16_w_bf16_n4096_fp8_e4m3_cfg_t128_r1_v8_reg(const normjit::NormParams params) {
  normjit::norm_fwd<Cfg>(params);
}
