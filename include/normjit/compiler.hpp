#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "normjit/spec.hpp"

namespace normjit {

// CUDA source for one resolved spec, rendered from the embedded templates.
struct GeneratedSource {
  std::string spec;         // canonical spec string
  std::string kernel_name;  // extern "C" name
  std::string source;       // the .cu text; deterministic for a spec
  int threads_per_cta = 0;
  int rows_per_cta = 0;
  int kernels = 1;  // __global__ functions in the program: 1 forward; 2 or 3 backward
  // Local memory (bytes) the kernel may keep for the CTAs per SM its launch bounds ask; past it,
  // or with none allowed, a spilling kernel is compiled again asking for one CTA per SM.
  int spill_allowance_bytes = 0;
  // NORMJIT_CAPPED_LAUNCH_BOUNDS: compiled again uncapped where it spills past the allowance.
  bool capped = false;
  // Register rows of a per-row scaled epilogue: compile() builds the kernel twice, holding y between
  // its two passes and normalizing again (NORMJIT_RENORMALIZE_ROW_Y), and keeps the second where
  // it fits more CTAs per SM than the first, which leaves fewer than 32 warps (H200, RMS fp8/row
  // 14336: 2 -> 3 CTAs of 448 threads, +13 %; where no CTA is gained, normalizing again lost 1-17 %).
  bool row_y_renormalize_option = false;
  // compile_batch may compile it in one program with others. Not the quantizing epilogues: they
  // call plain inline helpers (e2m1.h), which a second caller in the program may inline otherwise
  // (two fp8 forwards of the default manifest took other registers in a batch).
  bool batchable = false;
};
GeneratedSource generate(const Spec& resolved_spec);
// generate(resolved_spec).spill_allowance_bytes, without rendering the source.
int spill_allowance_bytes(const Spec& resolved_spec);

// Embedded headers the generated source includes: (name, contents).
const std::vector<std::pair<std::string, std::string>>& device_headers();

// A compiled kernel image: a cubin, or PTX when NVRTC could not target the arch itself.
struct Binary {
  std::string spec;
  std::string kernel_name;
  std::string arch;  // "sm_90"; for PTX the virtual arch it was built for, e.g. "compute_90"
  bool is_ptx = false;
  std::vector<char> image;
  int threads_per_cta = 0;
  int rows_per_cta = 0;
};

struct CompileResult {
  Binary binary;
  std::string log;
  double milliseconds = 0;
  // Local memory of the first compile when it had some and was compiled again (see compile());
  // 0 when the kernel was compiled once.
  int first_local_bytes = 0;
};

int nvrtc_version();                     // major*1000 + minor*10
std::vector<int> nvrtc_supported_archs();  // e.g. {75, 80, 86, 89, 90, ...}
std::string version();                   // normjit's version

// What to compile for: sm_XY. When NVRTC does not support XY, PTX for its newest arch below.
struct Target {
  int arch = 90;
  static Target parse(std::string_view text);  // "sm_90" or "90"
  std::string str() const;
};
// Options passed to NVRTC for a target (part of the cache key).
std::vector<std::string> compile_options(const Target& target, bool* emits_ptx = nullptr);

// Compiles generated source with NVRTC. Throws Error(kCompileFailed) with spec, options and log.
// The log carries ptxas's resource report (parse_ptxas_report). A cubin that used local memory is
// compiled once more with one CTA per SM asked, and the copy with less local memory is kept.
// extra_options are appended where not already among the options.
CompileResult compile(const GeneratedSource& src, const Target& target,
                      const std::vector<std::string>& extra_options = {});

// Several specs' sources compiled as one NVRTC program (on one thread) where that gives each
// kernel the code compile() would: batchable specs (GeneratedSource::batchable) whose kernels do
// not spill there. A spilling kernel (compile() alone tries other launch bounds), a spec compiled
// twice by choice (row_y_renormalize_option), the others and every spec of a PTX target are
// compiled alone. Each batched
// result's image is the whole program's cubin, holding every batched kernel; its kernel_name is
// its own spec's. split: a batch of one-kernel programs may take --split-compile where a core is
// idle; off by default, since it gave other code for 3 of 90 tuning candidates (streamed-row
// forwards of 2- and 4-element packs; scripts/batch_compare.cpp --candidates).
std::vector<CompileResult> compile_batch(const std::vector<GeneratedSource>& srcs, const Target& target,
                                         bool split = false);

// The groups compile_batch takes: items of one key (a target and phase) in groups of at most
// `batch`, each group in the order of its first item; an item whose key is empty, and every item
// where batch < 2, in a group of its own. Indices into `keys`.
inline std::vector<std::vector<size_t>> compile_batch_groups(const std::vector<std::string>& keys, size_t batch) {
  std::vector<std::vector<size_t>> groups;
  std::map<std::string, size_t> open_group;  // key -> its group being filled
  for (size_t i = 0; i < keys.size(); ++i) {
    if (batch < 2 || keys[i].empty()) {
      groups.push_back({i});
      continue;
    }
    auto it = open_group.find(keys[i]);
    if (it == open_group.end() || groups[it->second].size() >= batch) {
      groups.push_back({});
      it = open_group.insert_or_assign(keys[i], groups.size() - 1).first;
    }
    groups[it->second].push_back(i);
  }
  return groups;
}

// PTX of generated source for a virtual arch (compute_XY), for the driver to compile on any GPU of
// that arch or newer.
CompileResult compile_ptx(const GeneratedSource& src, int virtual_arch);

// Per-kernel resources parsed from a ptxas -v log.
struct KernelResources {
  std::string function;
  int registers = 0;
  int stack_frame_bytes = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
};
std::vector<KernelResources> parse_ptxas_report(const std::string& log);
// Whether a function of a compiled image is one of src's kernels: its name, or its name and a
// backward kernel's suffix (a batch's image and log hold every member's kernels).
bool is_kernel_of(const GeneratedSource& src, std::string_view function);

// Stack-frame bytes per function (local memory: spills land there) from a cubin's .nv.info
// records, for every function including device subroutines; nullopt if the image is not an
// ELF cubin this reader understands.
std::optional<std::map<std::string, int>> cubin_frame_bytes(const std::vector<char>& cubin);

// Disk cache of compiled kernels. Entries: <dir>/<spec>.<arch>.<key>.kernel, the .cu beside, and a
// .lock file per key that serializes compiles of that key across threads and processes.
struct CacheCounters {
  uint64_t disk_hits = 0;
  uint64_t compiles = 0;
  uint64_t corrupt_entries = 0;
  uint64_t write_failures = 0;
  uint64_t waited_hits = 0;  // hits that appeared while waiting for another compile of the key
  uint64_t evictions = 0;    // entries removed to stay under the size cap
  uint64_t not_stored = 0;   // compiled kernels whose entry is not in the directory (kept in memory only)
  uint64_t untrusted_entries = 0;    // entries not loaded: owned by another user, or writable by others
  uint64_t untrusted_directory = 0;  // 1 when the directory failed the trust check (nothing loaded or stored)
};

// An entry is GPU code that the process runs, checked only by a checksum its writer computed, so
// the cache loads only what the user (or, when shared, the directory's group) wrote.
struct DiskCacheOptions {
  // false (private): the directory must be owned by the effective user and writable by no one else;
  // directories the cache creates are 0700 and entries 0600; entries owned by another user are not
  // loaded. true (NORMJIT_CACHE_SHARED=1, for a team of ranks): the directory may be group-writable,
  // never world-writable; entries owned by members of its group are loaded; directories the cache
  // creates are 02770 and entries 0660.
  bool shared = false;
  uint64_t max_bytes = 0;        // NORMJIT_CACHE_MAX_BYTES; 0: no cap
  std::filesystem::path bundle;  // NORMJIT_BUNDLE; empty: none
  // From the environment; a bad value throws Error(kInvalidArgument) naming the variable and value.
  static DiskCacheOptions from_env();
};

class DiskCache {
 public:
  // Options from the environment (DiskCacheOptions::from_env()).
  explicit DiskCache(std::filesystem::path dir);
  DiskCache(std::filesystem::path dir, DiskCacheOptions options);
  static std::filesystem::path default_dir();  // NORMJIT_CACHE_DIR, $XDG_CACHE_HOME/normjit, ~/.cache/normjit

  // Where a lookup's binary came from, and whether its entry is in the directory now.
  struct Lookup {
    enum class Source { kDisk, kBundle, kCompiled };
    Binary binary;
    Source source = Source::kCompiled;
    double compile_ms = 0;  // NVRTC time (0 unless compiled)
    bool on_disk = false;   // the entry is in the directory (found there, or compiled and stored)
    std::string not_stored_why;  // compiled but not stored: why (the directory and the error)
  };
  // The binary for a resolved spec: from the bundle, else from the directory, else compiled and
  // stored. A directory that cannot be used leaves the cache working in memory only (logged once).
  Lookup lookup(const Spec& resolved_spec, const Target& target);
  // lookup() of several specs, the ones not in the bundle or the directory compiled together
  // (compile_batch): each entry then holds the batch's image. A miss's compile_ms is its share of
  // the batch's time.
  std::vector<Lookup> lookup_batch(const std::vector<Spec>& resolved_specs, const Target& target, bool split = false);
  // lookup()'s binary; compile_ms, when given, receives the NVRTC time (0 on a hit).
  Binary get_or_compile(const Spec& resolved_spec, const Target& target, double* compile_ms = nullptr);
  // The cache key (hex) for a generated source and target.
  static std::string key(const GeneratedSource& src, const Target& target);

  const std::filesystem::path& dir() const { return dir_; }
  bool shared() const { return options_.shared; }
  // Whether the directory may be read and written: created if missing, then checked once
  // (DiskCacheOptions); when not, logged once and the cache works in memory only.
  bool usable() { return open_dir(); }
  CacheCounters counters() const;
  // Least recently used entries (by modification time, which hits refresh; never atime) are
  // removed after each write until the entries' .kernel and .cu bytes fit. 0: no cap.
  void set_max_bytes(uint64_t bytes) { options_.max_bytes = bytes; }
  uint64_t max_bytes() const { return options_.max_bytes; }
  // Bytes of the entries (.kernel and .cu) now in the directory.
  uint64_t size_bytes() const;
  // The entry file a resolved spec compiles to for a target (whether or not it exists yet).
  std::filesystem::path entry_path(const Spec& resolved_spec, const Target& target) const;
  // Whether lookup() would find the spec in the bundle or the directory without compiling (an
  // entry that turns out invalid is still compiled again then).
  bool has_entry(const Spec& resolved_spec, const Target& target);
  // Entries are looked up in this bundle (verified when it is opened) before the directory; a
  // bundle is trusted because the user names it. Throws Error(kCacheError) naming a bad bundle.
  void use_bundle(const std::filesystem::path& bundle);

 private:
  // lookup() of a generated source; precompiled, when given, is used instead of compiling it.
  Lookup lookup_source(const GeneratedSource& src, const Target& target, CompileResult* precompiled);
  // entry_path() and has_entry() of a source already generated.
  std::filesystem::path entry_path_of(const GeneratedSource& src, const Target& target) const;
  bool has_entry_of(const GeneratedSource& src, const Target& target);
  void enforce_cap(const std::filesystem::path& keep);
  // Creates the directory if missing and checks that it may be trusted, once; false (with the
  // reason in unusable_why_, logged) when it is not to be read or written.
  bool open_dir();

  std::filesystem::path dir_;
  DiskCacheOptions options_;
  mutable std::mutex mutex_;
  CacheCounters counters_;
  enum class DirState { kUnchecked, kUsable, kUnusable } dir_state_ = DirState::kUnchecked;
  bool writable_ = true;
  std::string unusable_why_;  // why entries are not stored (first failure)
  uint32_t dir_gid_ = 0;      // the directory's group: a shared cache loads its members' entries
  std::map<std::string, std::string> bundle_entries_;  // entry file name -> entry bytes
};

// Bundles: one versioned file carrying many cache entries, for deployment. Layout: the magic
// "NJBUNDLE", a u32 format version, a u64 manifest size, the manifest (JSON: per entry its file
// name, spec, arch, size and XXH64), then the entries' bytes in manifest order. Each entry is
// also a complete cache entry with its own magic, version and checksum.
// Writes the named entries of a cache directory (all valid ones when `names` is empty) into a
// bundle; returns how many. Throws Error(kCacheError) naming a missing or invalid entry.
size_t export_bundle(const std::filesystem::path& cache_dir, const std::filesystem::path& bundle,
                     const std::vector<std::string>& names = {});
// Verifies the whole bundle first, then writes its entries into the cache directory (each
// renamed into place, with the modes of NORMJIT_CACHE_SHARED); a bad bundle writes nothing.
// Throws Error(kCacheError) when the directory cannot be created or fails the trust check
// (DiskCacheOptions). Returns how many entries it holds.
size_t import_bundle(const std::filesystem::path& bundle, const std::filesystem::path& cache_dir);

}  // namespace normjit
