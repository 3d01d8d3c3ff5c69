#pragma once
// The heuristic's per-GPU pick tables (generator/picks/sm*.txt, embedded at build time): their
// rows, parsed. Internal to normjit and its tests; docs/picks.md describes the format.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "normjit/spec.hpp"

namespace normjit::detail {

// One block of a table row: the config with its thread count given directly (t<T>) or as packs
// per thread (p<K>), whether it applies only where its threads take whole packs (@even),
// whether it applies where its cluster splits the row's packs unevenly (@ragged), and whether
// p<K>'s thread count rounds up to whole groups of four warps (@warps4).
struct TableBlock {
  BlockConfig block;
  int packs_per_thread = 0;  // > 0: threads = round_up(ceil(N / vec / cluster / K), 32, or 128 with @warps4)
  bool even_only = false;
  bool ragged = false;
  // Clustered backward segments of 2 packs a thread that are not whole four-warp groups ran up
  // to 18 % under the same segment on the next whole group (H200, docs/picks.md); why is not profiled.
  bool whole_warp_groups = false;
};

struct TableRow {
  bool backward = false;
  bool residual_only = false;   // phase bwd+residual: backward specs with the residual add only
  bool stream_f32_only = false;  // phases fwd+residual_f32, bwd+residual_f32: fp32 residual streams only
  bool quant_only = false;       // phase suffix +quant (forward only): quantized outputs only
  std::optional<Norm> norm;     // nullopt: any; kLayerNorm covers AdaLayerNorm
  std::optional<bool> has_bias;  // nullopt: any
  int x_bytes = 0;
  int vec = 0;
  int64_t n_from = 0, n_to = 0;
  std::vector<TableBlock> blocks;
};

struct PickTable {
  std::string name;
  std::vector<TableRow> rows;
};

// Parses a table; throws Error(kInvalidSpec) naming the table, the line and the problem.
PickTable parse_pick_table(std::string_view name, std::string_view text);
// The table for a GPU of compute capability sm (major*10 + minor), or nullptr.
const PickTable* pick_table_for_sm(int sm);
// A block's config at this spec, or nullopt where it does not apply (an uneven split without
// @ragged, a mask byte or scale block shared between CTAs, a cluster over max_cluster, or @even
// threads that take partial packs).
std::optional<BlockConfig> apply_pick_block(const TableBlock& block, const Spec& spec, int max_cluster);

}  // namespace normjit::detail
