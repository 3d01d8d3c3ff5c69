// normjit kernel layernorm.fwd_infer.f32.w_bf16.n262144.cfg_t1024_r1_v4_gmem
// Generated from templates/norm_fwd.cu.in: parameter binding only; the logic is in norm_fwd.cuh.
#include "normjit/norm_fwd.cuh"
#include "normjit/epilogue_none.cuh"

namespace {
struct Cfg {
  using XT = normjit::f32;  // the rows as normalized (f32 for an fp32 residual stream)
  using YT = normjit::f32;  // x as given, y, dy, dx
  using WT = normjit::bf16;
  using Epilogue = normjit::EpilogueNone;
  using Prologue = normjit::PrologueNone;
  static constexpr normjit::NormKind kNorm = normjit::NormKind::kLayerNorm;
  static constexpr bool kPerGroupWeights = false;
  static constexpr bool kTraining = false;
  static constexpr bool kHasBias = false;
  static constexpr bool kZeroCenteredGamma = false;  // the scale is 1 + gamma
  static constexpr int kN = 262144;
  static constexpr int kVec = 4;
  static constexpr int kThreadsPerRow = 1024;
  static constexpr int kRowsPerCta = 1;
  static constexpr int kCluster = 1;
  static constexpr int kStages = 2;  // row buffers of a pipelined row
  static constexpr bool kBulkCopy = false;  // pipelined rows filled by cp.async.bulk
  static constexpr normjit::RowCache kCache = normjit::RowCache::kGlobal;
};
}  // namespace

extern "C" __global__ void NORMJIT_LAUNCH_BOUNDS(1024)
normjit_layernorm_fwd_infer_f32_w_bf16_n262144_cfg_t1024_r1_v4_gmem(const normjit::NormParams params) {
  normjit::norm_fwd<Cfg>(params);
}
