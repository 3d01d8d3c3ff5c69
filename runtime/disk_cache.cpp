// Disk cache of compiled kernels. Each entry is written to a temp file and renamed into place,
// so a reader sees a whole entry or none. Entries carry a magic number, a format version and a
// checksum; anything that does not verify is never loaded, only recompiled and replaced.
#include <xxhash.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

#include "normjit/compiler.hpp"
#include "normjit/error.hpp"
#include "runtime/log.hpp"

namespace fs = std::filesystem;

namespace normjit {
namespace {

constexpr char kMagic[8] = {'N', 'J', 'K', 'E', 'R', 'N', 'E', 'L'};
constexpr uint32_t kFormatVersion = 1;

struct EntryHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t is_ptx;
  uint32_t threads_per_cta;
  uint32_t rows_per_cta;
  uint32_t name_size;
  uint32_t arch_size;
  uint64_t image_size;
  uint64_t checksum;  // XXH64 over name, arch and image
};

uint64_t entry_checksum(const std::string& name, const std::string& arch, const std::vector<char>& image) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, name.data(), name.size());
  XXH64_update(st, arch.data(), arch.size());
  XXH64_update(st, image.data(), image.size());
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

std::string serialize(const Binary& b) {
  EntryHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.format_version = kFormatVersion;
  h.is_ptx = b.is_ptx;
  h.threads_per_cta = b.threads_per_cta;
  h.rows_per_cta = b.rows_per_cta;
  h.name_size = static_cast<uint32_t>(b.kernel_name.size());
  h.arch_size = static_cast<uint32_t>(b.arch.size());
  h.image_size = b.image.size();
  h.checksum = entry_checksum(b.kernel_name, b.arch, b.image);
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out += b.kernel_name;
  out += b.arch;
  out.append(b.image.data(), b.image.size());
  return out;
}

// Returns why the bytes are not a valid entry, or an empty string and fills `b`.
std::string deserialize(const std::string& bytes, Binary& b) {
  EntryHeader h;
  if (bytes.size() < sizeof(h)) return "shorter than the entry header (" + std::to_string(bytes.size()) + " bytes)";
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return "bad magic";
  if (h.format_version != kFormatVersion)
    return "format version " + std::to_string(h.format_version) + ", expected " + std::to_string(kFormatVersion);
  const uint64_t want = sizeof(h) + uint64_t(h.name_size) + h.arch_size + h.image_size;
  if (bytes.size() != want) return "size " + std::to_string(bytes.size()) + ", header says " + std::to_string(want);
  const char* p = bytes.data() + sizeof(h);
  b.kernel_name.assign(p, h.name_size);
  b.arch.assign(p + h.name_size, h.arch_size);
  b.image.assign(p + h.name_size + h.arch_size, p + want - sizeof(h));
  if (entry_checksum(b.kernel_name, b.arch, b.image) != h.checksum) return "checksum mismatch";
  b.is_ptx = h.is_ptx != 0;
  b.threads_per_cta = static_cast<int>(h.threads_per_cta);
  b.rows_per_cta = static_cast<int>(h.rows_per_cta);
  return {};
}

bool read_file(const fs::path& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return static_cast<bool>(in) || in.eof();
}

// Writes to a unique temp name in the same directory, then renames over `path`.
void write_atomic(const fs::path& path, const std::string& bytes) {
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(Status::kCacheError, "cannot create " + tmp.string() + ": " + std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error(Status::kCacheError, "cannot write " + tmp.string() + ": " + std::strerror(errno));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(Status::kCacheError, "cannot rename into " + path.string() + ": " + ec.message());
  }
}

std::string hex128(XXH128_hash_t h) {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

}  // namespace

DiskCache::DiskCache(fs::path dir) : dir_(dir.empty() ? default_dir() : std::move(dir)) {}

fs::path DiskCache::default_dir() {
  if (const char* d = std::getenv("NORMJIT_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return fs::path(d) / "normjit";
  if (const char* d = std::getenv("HOME"); d && *d) return fs::path(d) / ".cache" / "normjit";
  return fs::temp_directory_path() / "normjit-cache";
}

std::string DiskCache::key(const GeneratedSource& src, const Target& target) {
  // Everything that changes the bytes: source, the headers it includes, options, arch,
  // NVRTC version and normjit version.
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  auto add = [&](const std::string& s) {
    const uint64_t n = s.size();
    XXH3_128bits_update(st, &n, sizeof(n));
    XXH3_128bits_update(st, s.data(), s.size());
  };
  add("normjit-cache-key-v1");
  add(version());
  add(std::to_string(nvrtc_version()));
  add(target.str());
  for (const auto& o : compile_options(target)) add(o);
  for (const auto& [name, text] : device_headers()) {
    add(name);
    add(text);
  }
  add(src.source);
  const std::string k = hex128(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  return k;
}

CacheCounters DiskCache::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

Binary DiskCache::get_or_compile(const Spec& spec, const Target& target, double* compile_ms) {
  if (!spec.block) throw Error(Status::kInvalidArgument, "DiskCache::get_or_compile(" + spec.str() + "): resolve() the spec first");
  if (compile_ms) *compile_ms = 0;
  const GeneratedSource src = generate(spec);
  const std::string k = key(src, target);
  const fs::path stem = dir_ / (src.spec + "." + target.str() + "." + k.substr(0, 32));
  const fs::path entry = stem.string() + ".kernel";

  std::string bytes;
  if (read_file(entry, bytes)) {
    Binary b;
    const std::string why = deserialize(bytes, b);
    if (why.empty() && b.kernel_name == src.kernel_name) {
      b.spec = src.spec;
      std::lock_guard<std::mutex> lock(mutex_);
      ++counters_.disk_hits;
      detail::log().debug("disk cache hit {} ({})", src.spec, entry.string());
      return b;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.corrupt_entries;
    detail::log().warn("disk cache entry {} is invalid ({}); recompiling {}", entry.string(),
                       why.empty() ? "kernel name mismatch" : why, src.spec);
  }

  CompileResult r = compile(src, target);
  if (compile_ms) *compile_ms = r.milliseconds;
  bool write_ok = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.compiles;
    write_ok = writable_;
  }
  if (write_ok) {
    try {
      std::error_code ec;
      fs::create_directories(dir_, ec);
      if (ec) throw Error(Status::kCacheError, "cannot create cache directory " + dir_.string() + ": " + ec.message());
      // The source first: a person can read what produced any entry they find.
      write_atomic(stem.string() + ".cu", src.source);
      write_atomic(entry, serialize(r.binary));
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++counters_.write_failures;
      if (writable_) detail::log().warn("{}; continuing with the in-memory cache only", e.what());
      writable_ = false;
    }
  }
  return std::move(r.binary);
}

}  // namespace normjit
