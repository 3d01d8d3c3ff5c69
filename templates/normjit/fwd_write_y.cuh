// The forward's output pass: y = norm(x) * gamma (+ beta) through the epilogue, for packs in
// registers or a row (segment) waiting in memory, with gamma and beta read as needed or held in
// registers by a persistent CTA.
#pragma once
#include "normjit/fwd_stats.cuh"

namespace normjit {

// gamma / beta packs a persistent CTA loads once into registers (kPacks > 0): its columns are the
// same for every row. Shared-memory rows otherwise lose them from L1 (which gives way to shared
// memory) and read them from L2 again on every row.
template <class WT, int kVec, int kPacks>
struct HeldWeights {
  Pack<WT, kVec> g[kPacks > 0 ? kPacks : 1], b[kPacks > 0 ? kPacks : 1];
};

// An epilogue's optional flags: Name<E>::value is E::member where E declares it, else false.
#define NORMJIT_OPTIONAL_FLAG(Name, member)                     \
  template <class E, class = void>                              \
  struct Name {                                                 \
    static constexpr bool value = false;                        \
  };                                                            \
  template <class E>                                            \
  struct Name<E, decltype(void(E::member))> {                   \
    static constexpr bool value = E::member;                    \
  };
// kRowScaled: the epilogue sees the finished row's largest |y|; the output pass is preceded by a
// pass that only measures it.
NORMJIT_OPTIONAL_FLAG(RowScaled, kRowScaled)
// kLaneLocal: the epilogue reads nothing of an invalid pack and reaches no other lane, so the
// output pass skips invalid packs whole: one branch a pack, no zeroed values.
NORMJIT_OPTIONAL_FLAG(LaneLocal, kLaneLocal)
// kOneOutputBody: a large output pass (the FP4 encoders) keeps one copy, testing p.y per pack;
// the others get one copy with y and one without, chosen once.
NORMJIT_OPTIONAL_FLAG(OneOutputBody, kOneOutputBody)
#undef NORMJIT_OPTIONAL_FLAG

// Epilogues with per-thread state (a `State` type) get it by reference in every hook call, and a
// `finish<kThreadsPerRow>(state, p)` call once the thread's rows are done, reached by every thread
// of the CTA (so it may reduce over the CTA). Others get an empty placeholder.
struct NoEpilogueState {};
template <class E, class = void>
struct EpilogueState {
  using type = NoEpilogueState;
  static constexpr bool kStateful = false;
};
template <class E>
struct EpilogueState<E, decltype(void(sizeof(typename E::State)))> {
  using type = typename E::State;
  static constexpr bool kStateful = true;
};
// The state a thread starts with: E::start(p) where the epilogue has one (to read launch-wide
// values once, not per pack), else value-initialized.
template <class E, class = void>
struct EpilogueStart {
  static __device__ __forceinline__ typename EpilogueState<E>::type make(const NormParams&) { return {}; }
};
template <class E>
struct EpilogueStart<E, decltype(void(&E::start))> {
  static __device__ __forceinline__ typename EpilogueState<E>::type make(const NormParams& p) { return E::start(p); }
};

// Normalizes, applies the epilogue and stores kCount packs. Every lane of the row group runs the
// loop (the epilogue may shuffle); only valid packs of active rows are read and written.
// Pointers and columns are relative to the CTA's segment; the epilogue sees the row's column.
// With kHeld packs of weights (first_pack a compile-time index then), gamma / beta come from `held`.
// row_amax: the row's largest |y|, for kRowScaled epilogues, whose rows take two passes:
//   kPassMeasure: nothing is stored; the return value is this thread's largest |y| over its packs
//     (NaN ignored), and the normalized packs go to `held_y` where given (register rows);
//   kPassWrite: as for every other epilogue, normalizing again (rows read from memory, and
//   register rows compiled with NORMJIT_RENORMALIZE_ROW_Y: see norm_fwd.cuh);
//   kPassWriteHeld: the epilogue and stores over `held_y` (register rows: normalized once).
// One loop body for every pass, so they normalize alike. kStoreY: whether y is stored; kYAuto
// (the callers') decides it once for the packs and calls this again with the answer: kYWhereSet
// tests p.y per pack (an epilogue with kOneOutputBody), kYNever / kYAlways compile the pass twice.
enum FwdPass { kPassWrite, kPassMeasure, kPassWriteHeld };
enum StoreY { kYNever, kYAlways, kYWhereSet, kYAuto };
template <class Cfg, int kCount, class XT, class WT, int kVec, int kHeld = 0, int kPass = kPassWrite,
          int kStoreY = kYAuto>
__device__ __forceinline__ float write_packs(const NormParams& p, const Pack<XT, kVec> (&packs)[kCount],
                                             int first_pack, int lane, long long row, bool active,
                                             typename Cfg::YT* y,
                                             const WT* gamma, const WT* beta, float center, float shift,
                                             float rstd, int segment_col,
                                             const HeldWeights<WT, kVec, kHeld>* held = nullptr,
                                             float row_amax = 0.f,
                                             typename EpilogueState<typename Cfg::Epilogue>::type* state = nullptr,
                                             float (*held_y)[kVec] = nullptr) {
  if constexpr (kStoreY == kYAuto) {
    using E = typename Cfg::Epilogue;
    constexpr bool kYKnown = E::kAlwaysStoresY || kPass == kPassMeasure;
    if constexpr (kYKnown || OneOutputBody<E>::value) {
      return write_packs<Cfg, kCount, XT, WT, kVec, kHeld, kPass, kYKnown ? kYAlways : kYWhereSet>(
          p, packs, first_pack, lane, row, active, y, gamma, beta, center, shift, rstd, segment_col, held, row_amax,
          state, held_y);
    } else {
      // An optional y (quantizing epilogues) is one uniform branch here, and none in the packs.
      return p.y != nullptr ? write_packs<Cfg, kCount, XT, WT, kVec, kHeld, kPass, kYAlways>(
                                  p, packs, first_pack, lane, row, active, y, gamma, beta, center, shift, rstd,
                                  segment_col, held, row_amax, state, held_y)
                            : write_packs<Cfg, kCount, XT, WT, kVec, kHeld, kPass, kYNever>(
                                  p, packs, first_pack, lane, row, active, y, gamma, beta, center, shift, rstd,
                                  segment_col, held, row_amax, state, held_y);
    }
  }
  using S = FwdShape<Cfg>;
  using YT = typename Cfg::YT;  // y's type; the packs are the rows' (XT)
  // LayerNorm with a 16-bit y normalizes in one FFMA, (x - center) * rstd + (-shift * rstd),
  // saving an instruction an element (the quantizing LayerNorms are issue-bound). The rounded
  // shift * rstd costs at most 2^-24 * |shift| * rstd, |shift| <= sqrt(N) * std: under 2^-15 of
  // the row's std at N = 262144, far below y's half ulp. fp32 y keeps the exact subtractions.
  constexpr bool kFmaCentring = Cfg::kNorm == NormKind::kLayerNorm && sizeof(YT) < 4;
  const float neg_shift_rstd = -shift * rstd;
  using Epilogue = typename Cfg::Epilogue;
  constexpr bool kSkipInvalid = LaneLocal<Epilogue>::value;
  // Quantizing epilogues (y optional): where the threads' packs tile the row and these packs lie
  // within a thread's kIters, every pack of an active row is valid, known without a test.
  constexpr bool kAllValid = !Epilogue::kAlwaysStoresY && !OneOutputBody<Epilogue>::value &&
                             !S::kRagged && S::kVecs % S::kThreads == 0 && S::kIters % kCount == 0;
  // Row-scaled epilogues: what the writing pass's packs share, formed ahead of them (row_arg),
  // except over held y (kPassWriteHeld: in the packs; ahead, it took an fp32-stream row of 896
  // threads from 32 to 35 registers, two CTAs a SM to one).
  constexpr bool kRowArgAhead = kPass == kPassWrite;
  const auto row_arg = [&] {
    if constexpr (RowScaled<Epilogue>::value && kRowArgAhead)
      return Epilogue::template row_arg<true>(row_amax);
    else
      return row_amax;
  }();
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const int pack = (first_pack + i) * S::kThreads + lane;
    const bool valid = active && (kAllValid || pack < NORMJIT_SEGMENT_VECS(S));
    const int col = pack * kVec;
    // The measuring pass's amax and held_y lose nothing: a skipped pack's zeros add nothing to
    // amax, and its held_y is never read.
    if constexpr (kSkipInvalid)
      if (!valid) continue;
    float out[kVec];
    if constexpr (kPass == kPassWriteHeld) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) out[j] = held_y[i][j];
    } else if (valid) {
      Pack<WT, kVec> g, b;
      if constexpr (kHeld > 0) {
        g = held->g[first_pack + i];
        if constexpr (Cfg::kHasBias) b = held->b[first_pack + i];
      } else {
        g = load_pack<WT, kVec>(gamma + col);
        if constexpr (Cfg::kHasBias) b = load_pack<WT, kVec>(beta + col);
      }
      float xf[kVec], gf[kVec], bf[kVec];
      unpack(packs[i], xf);
      unpack_scale<Cfg>(g, gf);
      if constexpr (Cfg::kHasBias) unpack(b, bf);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        // The mean is center + shift, kept as two floats: one rounded fp32 mean would cost
        // up to half an ulp of |mean| in every output.
        if constexpr (kFmaCentring)
          out[j] = fmaf(xf[j] - center, rstd, neg_shift_rstd) * gf[j];
        else
          out[j] = ((xf[j] - center) - shift) * rstd * gf[j];
        if constexpr (Cfg::kHasBias) out[j] += bf[j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) out[j] = 0.f;
    }
    if constexpr (kPass == kPassMeasure) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        amax = fmaxf(amax, fabsf(out[j]));
        if (held_y) held_y[i][j] = out[j];
      }
      continue;
    }
    if constexpr (RowScaled<Epilogue>::value && kRowArgAhead)
      Cfg::Epilogue::template forward<YT, kVec, S::kThreads>(out, valid, p, row, segment_col + col, lane, row_arg);
    else if constexpr (RowScaled<Epilogue>::value)
      Cfg::Epilogue::template forward<YT, kVec, S::kThreads>(out, valid, p, row, segment_col + col, lane,
                                                             Epilogue::template row_arg<false>(row_amax));
    else if constexpr (EpilogueState<typename Cfg::Epilogue>::kStateful)
      Cfg::Epilogue::template forward<YT, kVec, S::kThreads>(out, valid, p, row, segment_col + col, lane, *state);
    else
      Cfg::Epilogue::template forward<YT, kVec, S::kThreads>(out, valid, p, row, segment_col + col, lane);
    if (valid && (kStoreY == kYAlways || (kStoreY == kYWhereSet && p.y != nullptr))) {
      Pack<YT, kVec> o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) o.v[j] = Convert<YT>::from(out[j]);
      // Clustered and pipelined rows: plain stores came out split (see store_output_pack).
      constexpr bool kAsmStore = S::kCluster > 1 || Cfg::kCache == RowCache::kSharedPipelined;
      store_output_pack<YT, kVec, kAsmStore>(y + col, o);
    }
  }
  return amax;
}

// The output pass over a row waiting in `source` (shared memory, or x again), kChunk packs at a time.
template <class Cfg, class XT, class WT, int kHeld = 0>
__device__ __forceinline__ void write_row(const NormParams& p, const XT* source, int lane, long long row, bool active,
                                          typename Cfg::YT* y, const WT* gamma, const WT* beta, float center, float shift,
                                          float rstd, int segment_col,
                                          const HeldWeights<WT, Cfg::kVec, kHeld>* held = nullptr,
                                          float row_amax = 0.f,
                                          typename EpilogueState<typename Cfg::Epilogue>::type* state = nullptr) {
  using S = FwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  // Held weights are indexed by pack: the chunks must unroll for them to stay in registers.
#pragma unroll(kHeld > 0 ? S::kIters : 1)
  for (int base = 0; base < S::kIters; base += S::kChunk) {
    Pack<XT, kVec> chunk[S::kChunk];
    load_chunk<Cfg>(chunk, source, base, lane, active);
    write_packs<Cfg, S::kChunk, XT, WT, kVec, kHeld>(p, chunk, base, lane, row, active, y, gamma, beta, center,
                                                     shift, rstd, segment_col, held, row_amax, state);
  }
}

// The measuring pass (write_packs' kPassMeasure) over a row waiting in `source`, as write_row reads it.
template <class Cfg, class XT, class WT, int kHeld = 0>
__device__ __forceinline__ float row_source_amax(const NormParams& p, const XT* source, int lane, long long row,
                                                 bool active, const WT* gamma, const WT* beta, float center,
                                                 float shift, float rstd,
                                                 const HeldWeights<WT, Cfg::kVec, kHeld>* held = nullptr) {
  using S = FwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  float amax = 0.f;
#pragma unroll(kHeld > 0 ? S::kIters : 1)
  for (int base = 0; base < S::kIters; base += S::kChunk) {
    Pack<XT, kVec> chunk[S::kChunk];
    load_chunk<Cfg>(chunk, source, base, lane, active);
    amax = fmaxf(amax, write_packs<Cfg, S::kChunk, XT, WT, kVec, kHeld, kPassMeasure>(
                           p, chunk, base, lane, row, active, nullptr, gamma, beta, center, shift, rstd, 0, held));
  }
  return amax;
}

}  // namespace normjit
