#pragma once
// Autotuning: the block-config space of a spec, and the tuning database of measured winners.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "normjit/spec.hpp"

namespace normjit {

// The configurations the tuner times for a spec on an sm_XY target: every one that validate()
// accepts among a pruned grid (vector width at most two steps below the widest, thread counts
// that are powers of two times 32 or split the row evenly, rows per CTA giving 64-256-thread CTAs,
// clusters of 2-8 on sm_90+, shared-memory rows where they fit). The heuristic's own choice is
// always first. At most `limit` configurations, nearest the heuristic's thread count first.
std::vector<BlockConfig> candidate_configs(const Spec& spec, int sm, int max_vec = 16, size_t limit = 48);

// A candidate's time from a search_candidates callback: the median microseconds per launch, and
// whether its outputs passed verification (an unverified candidate cannot win).
struct CandidateTime {
  double us = 0;
  bool verified = true;
};

// What search_candidates found. The first candidate it timed stands for the heuristic: it is
// candidates[0] unless that one threw.
struct CandidateSearch {
  std::optional<BlockConfig> best;  // the fastest verified candidate; none when none ran and verified
  double best_us = 0;
  double heuristic_us = 0;  // the first timed candidate's, verified or not
  int timed = 0;            // time_us returned, verified or not
  int skipped = 0;          // local_memory_bytes or time_us threw Error
  int pruned = 0;           // not timed: local memory
  int dropped = 0;          // not started: the budget was spent
};

// The tuner's search, shared by Runtime (NORMJIT_TUNING=tune) and normjit-tune; the GPU work is
// in the callbacks. Candidates are tried in order, and each one after the first timed one is
//  - not started once budget_s seconds have passed since the call (budget_s <= 0: no limit), nor
//    any after it;
//  - pruned, without timing, when local_memory_bytes(b) > 0: it spills.
// A candidate whose local_memory_bytes or time_us throws Error is skipped. Ties keep the earlier
// candidate. note(b, "pruned" or "skipping", why) is called for each pruned or skipped candidate,
// for the caller's message. Exceptions other than Error propagate.
CandidateSearch search_candidates(const std::vector<BlockConfig>& candidates, double budget_s,
                                  const std::function<int(const BlockConfig&)>& local_memory_bytes,
                                  const std::function<CandidateTime(const BlockConfig&)>& time_us,
                                  const std::function<void(const BlockConfig&, const char* what,
                                                           const std::string& why)>& note);

// What a measured winner is valid for: the device, the software that built and ran it, the spec.
struct TuningKey {
  std::string device;  // device name, e.g. "NVIDIA H100 80GB HBM3"
  int sm = 0;          // compute capability, major*10 + minor
  int sm_count = 0;
  int driver = 0;      // cuDriverGetVersion
  int nvrtc = 0;       // nvrtc_version()
  std::string normjit;  // version()
  std::string spec;    // canonical spec string without a block config
  bool operator<(const TuningKey& o) const;
  bool operator==(const TuningKey& o) const;
};

struct TuningEntry {
  BlockConfig config;
  double us = 0;            // the winner's median time per launch
  double heuristic_us = 0;  // the heuristic's, measured in the same run
  int64_t rows = 0;         // rows it was timed at
};

// A JSON file of winners ({"format": "normjit-tuning-db", "version": 1, "entries": [...]}). Merging
// keeps, per key, the fastest entry (ties: the smaller config string), so databases from several
// machines or ranks merge to the same result in any order.
class TuningDb {
 public:
  // Throws Error(kInvalidArgument) naming the file and what is wrong with it.
  static TuningDb load(const std::string& path);
  static TuningDb parse(const std::string& json_text, const std::string& name);
  // Written to a temp file and renamed into place.
  void save(const std::string& path) const;
  std::string dump() const;

  void record(const TuningKey& key, const TuningEntry& entry);  // keeps the faster of old and new
  void merge(const TuningDb& other);
  std::optional<TuningEntry> lookup(const TuningKey& key) const;
  size_t size() const { return entries_.size(); }
  const std::map<TuningKey, TuningEntry>& entries() const { return entries_; }

 private:
  std::map<TuningKey, TuningEntry> entries_;
};

// How Runtime picks a block config for a spec without one: NORMJIT_TUNING=heuristic | db (the
// default when the database file exists) | tune (db, and a spec missing from it is tuned on the
// spot: NORMJIT_TUNE_CANDIDATES (8) candidates timed on NORMJIT_TUNE_ROWS rows of random data, for
// at most NORMJIT_TUNE_BUDGET_S seconds (0: no limit), the winner merged into the file under a
// lock). The database path is NORMJIT_TUNING_DB, else <cache dir>/tuning.json.
enum class TuningMode { kHeuristic, kDatabase, kTuneOnMiss };
TuningMode tuning_mode_from_env(bool database_exists);

}  // namespace normjit
