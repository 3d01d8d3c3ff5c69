// Disk cache of compiled kernels. Each entry is written to a temp file and renamed into place,
// so a reader sees a whole entry or none, and a writer killed mid-write leaves only a temp file.
// Entries carry a magic number, a format version and a checksum; anything that does not verify is
// never loaded, only recompiled and replaced. A per-key lock file (flock) makes one thread or
// process compile a missing key while the others wait and then read its entry.
// An entry is code the process will run, and its checksum proves nothing about who wrote it: the
// directory must be the user's own (or, opted in, its group's), and entries are loaded only from
// their owners (DiskCacheOptions).
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "generator/embedded.hpp"
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

// One read into a buffer of the file's size: this is on every disk-cache hit. `check`, when given,
// sees the opened file's status first (the file read, not whatever the name points at later) and
// returns false to skip it.
template <class Check = std::nullptr_t>
bool read_file(const fs::path& path, std::string& out, Check check = nullptr) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0;
  if constexpr (!std::is_same_v<Check, std::nullptr_t>) {
    if (ok && !check(st)) {
      ::close(fd);
      return false;
    }
  }
  if (ok) {
    out.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (ok && done < out.size()) {
      const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ok = false;  // an error, or the file shrank: the caller sees a bad entry
      else done += static_cast<size_t>(n);
    }
    out.resize(done);
  }
  ::close(fd);
  return ok || !out.empty();
}

// Writes to a unique temp name in the same directory, then renames over `path`. With `mode`, the
// file gets exactly that mode (the umask neither narrows nor widens it); without, 0666 less the umask.
void write_atomic(const fs::path& path, const std::string& bytes, std::optional<mode_t> mode = std::nullopt) {
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  auto fail = [&](const char* what) {
    const std::string why = std::strerror(errno);
    std::error_code ec;
    fs::remove(tmp, ec);
    return Error(Status::kCacheError, std::string("cannot ") + what + " " + path.string() + " (temp file " +
                                          tmp.filename().string() + "): " + why);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode.value_or(0666));
  if (fd < 0) throw fail("create");
  bool ok = !mode || ::fchmod(fd, *mode) == 0;
  for (size_t done = 0; ok && done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ok = false;
    else done += static_cast<size_t>(n);
  }
  if (!ok) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    throw fail("write");
  }
  if (::close(fd) != 0) throw fail("write");
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw fail("rename into");
}

mode_t dir_mode(bool shared) { return shared ? 02770 : 0700; }
mode_t entry_mode(bool shared) { return shared ? 0660 : 0600; }

std::string octal(mode_t m) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// Creates `dir` and its missing parents with exactly `mode` (chmod after mkdir: the umask would
// narrow it, and mkdir may drop the setgid bit); parents that exist are left as they are.
std::string make_dirs(const fs::path& dir, mode_t mode) {
  fs::path p;
  for (const fs::path& part : dir) {
    p /= part;
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) continue;
    if (::mkdir(p.c_str(), mode) == 0) {
      if (::chmod(p.c_str(), mode) != 0) return "cannot set mode " + octal(mode) + " on " + p.string() + ": " + std::strerror(errno);
    } else if (errno != EEXIST) {
      return "cannot create cache directory " + p.string() + ": " + std::strerror(errno);
    }
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "cannot create cache directory " + dir.string() + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "cannot use cache directory " + dir.string() + ": it exists and is not a directory";
  return {};
}

bool in_own_groups(gid_t gid) {
  if (gid == ::getegid()) return true;
  const int n = ::getgroups(0, nullptr);
  std::vector<gid_t> groups(n > 0 ? n : 0);
  const int got = n > 0 ? ::getgroups(n, groups.data()) : 0;
  return std::find(groups.begin(), groups.begin() + std::max(got, 0), gid) != groups.begin() + std::max(got, 0);
}

// Whether user `uid` is a member of group `gid` (primary or supplementary); memoized.
bool user_in_group(uid_t uid, gid_t gid) {
  static std::mutex m;
  static std::map<std::pair<uid_t, gid_t>, bool> known;
  std::lock_guard<std::mutex> lock(m);
  if (auto it = known.find({uid, gid}); it != known.end()) return it->second;
  bool member = false;
  std::vector<char> buf(16384);
  struct passwd pw {};
  struct passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found) {
    member = pw.pw_gid == gid;
    int n = 64;
    std::vector<gid_t> groups(n);
    if (!member && ::getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
      groups.resize(n);
      ::getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n);
    }
    if (!member) member = std::find(groups.begin(), groups.begin() + std::min<size_t>(n, groups.size()), gid) !=
                          groups.begin() + std::min<size_t>(n, groups.size());
  }
  return known[{uid, gid}] = member;
}

// Why the cache directory (whose status is `st`) must not be trusted, and the fix; empty when it may.
struct Distrust {
  std::string why, fix;
  bool empty() const { return why.empty(); }
};
Distrust distrust_dir(const fs::path& dir, const struct stat& st, bool shared) {
  const uid_t me = ::geteuid();
  if (st.st_uid != me && !(shared && in_own_groups(st.st_gid))) {
    return {"it is owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " + std::to_string(me) +
                (shared ? " (and its group " + std::to_string(st.st_gid) + " is not one of this process's)" : ""),
            "set NORMJIT_CACHE_DIR to a directory of your own" +
                std::string(shared ? "" : ", or set NORMJIT_CACHE_SHARED=1 if it is a cache shared by a group you trust")};
  }
  const mode_t bad = shared ? S_IWOTH : (S_IWGRP | S_IWOTH);
  if (st.st_mode & bad) {
    return {"its mode " + octal(st.st_mode) + " lets " + ((st.st_mode & S_IWOTH) ? "other users" : "its group") +
                " write entries this process would run",
            std::string("chmod ") + (shared ? "2770 " : "700 ") + dir.string() +
                ", or set NORMJIT_CACHE_DIR to another directory" +
                (shared ? "" : ", or set NORMJIT_CACHE_SHARED=1 for a cache shared by the directory's group "
                               "(group-writable, never world-writable)")};
  }
  return {};
}

// Why an entry file (status `st`) in a trusted directory of group `dir_gid` must not be loaded.
std::string distrust_entry(const struct stat& st, bool shared, gid_t dir_gid) {
  if (st.st_uid != ::geteuid() && !(shared && user_in_group(st.st_uid, dir_gid)))
    return "it is owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " + std::to_string(::geteuid()) +
           (shared ? " nor by a member of the directory's group " + std::to_string(dir_gid) : "");
  const mode_t bad = shared ? S_IWOTH : (S_IWGRP | S_IWOTH);
  if (st.st_mode & bad) return "its mode " + octal(st.st_mode) + " lets other users change it";
  return {};
}

// An exclusive flock on `path`, created if missing. The inode is checked after locking: eviction
// unlinks lock files (under the lock), and a lock on an unlinked inode would exclude no one.
class FileLock {
 public:
  // Blocking; returns an unlocked object (ok() false) when the file cannot be created.
  static FileLock acquire(const fs::path& path, bool wait, mode_t mode) {
    for (;;) {
      int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, mode);
      // Another member's lock file in a shared cache: flock needs no write access.
      if (fd < 0 && errno == EACCES) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return FileLock(-1);
      if (::flock(fd, wait ? LOCK_EX : LOCK_EX | LOCK_NB) != 0) {
        ::close(fd);
        return FileLock(-1);
      }
      struct stat held, named;
      if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
          held.st_dev == named.st_dev) {
        // The umask may have narrowed the mode: other members of a shared cache must open it too.
        if (held.st_uid == ::geteuid() && (held.st_mode & 07777) != mode) (void)::fchmod(fd, mode);
        return FileLock(fd);
      }
      ::close(fd);  // unlinked or replaced while we waited: lock the file that is there now
    }
  }
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the flock
  }
  bool ok() const { return fd_ >= 0; }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

bool shared_from_env() {
  const char* v = std::getenv("NORMJIT_CACHE_SHARED");
  if (!v || !*v) return false;
  const std::string s = v;
  if (s == "1") return true;
  if (s == "0") return false;
  throw Error(Status::kInvalidArgument, "NORMJIT_CACHE_SHARED='" + s + "' is not 0 or 1");
}

uint64_t max_bytes_from_env() {
  const char* v = std::getenv("NORMJIT_CACHE_MAX_BYTES");
  if (!v || !*v) return 0;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (errno != 0 || *end != '\0' || v[0] == '-')
    throw Error(Status::kInvalidArgument,
                std::string("NORMJIT_CACHE_MAX_BYTES='") + v + "' is not a byte count (a non-negative integer)");
  return n;
}

fs::path sibling(const fs::path& entry, const char* ext) {
  fs::path p = entry;
  return p.replace_extension(ext);
}

std::string hex128(XXH128_hash_t h) {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

}  // namespace

DiskCacheOptions DiskCacheOptions::from_env() {
  DiskCacheOptions o;
  o.shared = shared_from_env();
  o.max_bytes = max_bytes_from_env();
  if (const char* b = std::getenv("NORMJIT_BUNDLE"); b && *b) o.bundle = b;
  return o;
}

DiskCache::DiskCache(fs::path dir) : DiskCache(std::move(dir), DiskCacheOptions::from_env()) {}

DiskCache::DiskCache(fs::path dir, DiskCacheOptions options)
    : dir_(dir.empty() ? default_dir() : std::move(dir)), options_(std::move(options)) {
  if (!options_.bundle.empty()) use_bundle(options_.bundle);
}

bool DiskCache::open_dir() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (dir_state_ == DirState::kUsable) {
    // Removed while in use: made again, private as before.
    struct stat st {};
    if (::stat(dir_.c_str(), &st) == 0 || errno != ENOENT) return true;
  } else if (dir_state_ == DirState::kUnusable) {
    return false;
  }
  std::string why = make_dirs(dir_, dir_mode(options_.shared));
  struct stat st {};
  if (why.empty() && ::stat(dir_.c_str(), &st) != 0) why = "cannot use cache directory " + dir_.string() + ": " + std::strerror(errno);
  if (!why.empty()) {
    ++counters_.write_failures;
    detail::log().warn("{}; continuing with the in-memory cache only", why);
  } else if (const Distrust d = distrust_dir(dir_, st, options_.shared); !d.empty()) {
    why = "disk cache directory " + dir_.string() + " is not trusted: " + d.why;
    ++counters_.untrusted_directory;
    detail::log().error("{}; not loading or storing kernels there, continuing with the in-memory cache only. Fix: {}",
                        why, d.fix);
    why += ". Fix: " + d.fix;
  } else {
    dir_gid_ = st.st_gid;
    dir_state_ = DirState::kUsable;
    return true;
  }
  unusable_why_ = why;
  writable_ = false;
  dir_state_ = DirState::kUnusable;
  return false;
}

fs::path DiskCache::default_dir() {
  if (const char* d = std::getenv("NORMJIT_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return fs::path(d) / "normjit";
  if (const char* d = std::getenv("HOME"); d && *d) return fs::path(d) / ".cache" / "normjit";
  return fs::temp_directory_path() / "normjit-cache";
}

std::string DiskCache::key(const GeneratedSource& src, const Target& target) {
  // Everything that changes the bytes: source, the headers it includes, options, arch,
  // NVRTC version and normjit version.
  auto add = [](XXH3_state_t* st, const std::string& s) {
    const uint64_t n = s.size();
    XXH3_128bits_update(st, &n, sizeof(n));
    XXH3_128bits_update(st, s.data(), s.size());
  };
  // Everything but the source is fixed for a target and its options (which follow the
  // environment): hashed once per such prefix, then copied for each key.
  static std::mutex prefix_mutex;
  static std::map<std::string, std::shared_ptr<XXH3_state_t>> prefixes;
  const std::vector<std::string> options = compile_options(target);
  std::string id = target.str();
  for (const auto& o : options) id += '\n' + o;
  std::shared_ptr<XXH3_state_t> prefix;
  {
    std::lock_guard<std::mutex> lock(prefix_mutex);
    auto& slot = prefixes[id];
    if (!slot) {
      slot.reset(XXH3_createState(), XXH3_freeState);
      XXH3_128bits_reset(slot.get());
      // v2: a spilling kernel is compiled again (compile); v3: the headers by their build-time digest.
      add(slot.get(), "normjit-cache-key-v3");
      add(slot.get(), version());
      add(slot.get(), std::to_string(nvrtc_version()));
      add(slot.get(), target.str());
      for (const auto& o : options) add(slot.get(), o);
      // The headers by their build-time digest: hashing (and copying out) the headers themselves
      // would weigh on a fresh process's first lookup.
      add(slot.get(), std::string(detail::embedded_templates_digest()));
    }
    prefix = slot;
  }
  XXH3_state_t st;
  XXH3_copyState(&st, prefix.get());
  add(&st, src.source);
  return hex128(XXH3_128bits_digest(&st));
}

CacheCounters DiskCache::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

fs::path DiskCache::entry_path(const Spec& spec, const Target& target) const {
  return entry_path_of(generate(spec), target);
}

fs::path DiskCache::entry_path_of(const GeneratedSource& src, const Target& target) const {
  return dir_ / (src.spec + "." + target.str() + "." + key(src, target).substr(0, 32) + ".kernel");
}

bool DiskCache::has_entry(const Spec& spec, const Target& target) { return has_entry_of(generate(spec), target); }

bool DiskCache::has_entry_of(const GeneratedSource& src, const Target& target) {
  const fs::path entry = entry_path_of(src, target);
  if (bundle_entries_.count(entry.filename().string())) return true;
  std::error_code ec;
  return open_dir() && fs::exists(entry, ec);
}

Binary DiskCache::get_or_compile(const Spec& spec, const Target& target, double* compile_ms) {
  Lookup r = lookup(spec, target);
  if (compile_ms) *compile_ms = r.compile_ms;
  return std::move(r.binary);
}

DiskCache::Lookup DiskCache::lookup(const Spec& spec, const Target& target) {
  if (!spec.block) throw Error(Status::kInvalidArgument, "DiskCache::lookup(" + spec.str() + "): resolve() the spec first");
  return lookup_source(generate(spec), target, nullptr);
}

std::vector<DiskCache::Lookup> DiskCache::lookup_batch(const std::vector<Spec>& specs, const Target& target,
                                                       bool split) {
  std::vector<GeneratedSource> srcs;
  for (const Spec& spec : specs) {
    if (!spec.block)
      throw Error(Status::kInvalidArgument, "DiskCache::lookup_batch(" + spec.str() + "): resolve() the spec first");
    srcs.push_back(generate(spec));
  }
  // The misses compiled together first; each spec then goes through lookup_source as lookup()
  // does (its key's lock, a second look, the write), with its compiled result in hand. The
  // compile does not wait for the keys' locks: two processes may compile a batch both, and the
  // second then finds the first's entries.
  std::vector<GeneratedSource> missing;
  std::vector<size_t> missing_index;
  for (size_t i = 0; i < specs.size(); ++i)
    if (!has_entry_of(srcs[i], target)) {  // the source generated above, not again
      missing.push_back(srcs[i]);
      missing_index.push_back(i);
    }
  std::vector<CompileResult> compiled = compile_batch(missing, target, split);
  std::vector<CompileResult*> precompiled(specs.size(), nullptr);
  for (size_t m = 0; m < missing_index.size(); ++m) precompiled[missing_index[m]] = &compiled[m];
  std::vector<Lookup> out;
  for (size_t i = 0; i < specs.size(); ++i) out.push_back(lookup_source(srcs[i], target, precompiled[i]));
  return out;
}

DiskCache::Lookup DiskCache::lookup_source(const GeneratedSource& src, const Target& target, CompileResult* precompiled) {
  Lookup result;
  const std::string k = key(src, target);
  const fs::path stem = dir_ / (src.spec + "." + target.str() + "." + k.substr(0, 32));
  const fs::path entry = stem.string() + ".kernel";
  const bool shared = options_.shared;

  // The binary in an entry's bytes when they are a valid entry for this kernel; else `why` says why.
  auto decode = [&](const std::string& bytes, std::string& why) -> std::optional<Binary> {
    Binary b;
    why = deserialize(bytes, b);
    if (why.empty() && b.kernel_name != src.kernel_name) why = "kernel name mismatch";
    if (!why.empty()) return std::nullopt;
    b.spec = src.spec;
    return b;
  };
  // A valid entry on disk from a trusted writer, or nothing; `report` logs and counts a bad one.
  auto load = [&](bool report) -> std::optional<Binary> {
    std::string bytes, why, distrust;
    const bool read = read_file(entry, bytes, [&](const struct stat& st) {
      distrust = distrust_entry(st, shared, static_cast<gid_t>(dir_gid_));
      return distrust.empty();
    });
    if (!distrust.empty()) {
      if (report) {
        std::lock_guard<std::mutex> lock(mutex_);
        ++counters_.untrusted_entries;
        detail::log().warn("disk cache entry {} is not trusted ({}): not loading it; recompiling {}", entry.string(),
                           distrust, src.spec);
      }
      return std::nullopt;
    }
    if (!read) return std::nullopt;
    if (auto b = decode(bytes, why)) return b;
    if (report) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++counters_.corrupt_entries;
      detail::log().warn("disk cache entry {} is invalid ({}); recompiling {}", entry.string(), why, src.spec);
    }
    return std::nullopt;
  };
  auto hit = [&](Binary b, bool waited) {
    if (options_.max_bytes > 0) {
      // LRU by modification time (atime is unreliable on shared and noatime filesystems);
      // refreshed at most once a minute per entry.
      std::error_code ec;
      const auto now = fs::file_time_type::clock::now();
      const auto mtime = fs::last_write_time(entry, ec);
      if (!ec && now - mtime > std::chrono::minutes(1)) fs::last_write_time(entry, now, ec);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.disk_hits;
    if (waited) ++counters_.waited_hits;
    detail::log().debug("disk cache hit {} ({})", src.spec, entry.string());
    result.binary = std::move(b);
    result.source = Lookup::Source::kDisk;
    result.on_disk = true;
    return std::move(result);
  };
  if (!bundle_entries_.empty()) {
    // A bundle's entries were verified when it was opened.
    if (auto it = bundle_entries_.find(entry.filename().string()); it != bundle_entries_.end()) {
      std::string why;
      if (auto b = decode(it->second, why)) {
        std::lock_guard<std::mutex> lock(mutex_);
        ++counters_.disk_hits;
        result.binary = std::move(*b);
        result.source = Lookup::Source::kBundle;
        return result;
      }
    }
  }
  const bool dir_ok = open_dir();
  if (dir_ok) {
    if (auto b = load(true)) return hit(std::move(*b), false);
  }

  bool write_ok;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    write_ok = dir_ok && writable_;
  }
  auto write_failed = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.write_failures;
    if (writable_) {
      detail::log().warn("{}; continuing with the in-memory cache only", what);
      unusable_why_ = what;
    }
    writable_ = false;
    write_ok = false;
  };
  std::optional<FileLock> key_lock;
  if (write_ok) {
    // Single flight: whoever holds the key's lock compiles; the others wait here, then find its
    // entry.
    key_lock.emplace(FileLock::acquire(stem.string() + ".lock", true, entry_mode(shared)));
    if (!key_lock->ok()) {
      write_failed("cannot lock " + stem.string() + ".lock: " + std::strerror(errno));
    } else if (auto b = load(false)) {
      return hit(std::move(*b), true);
    }
  }

  CompileResult r = precompiled ? std::move(*precompiled) : compile(src, target);
  result.compile_ms = r.milliseconds;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.compiles;
  }
  if (write_ok) {
    try {
      // The source first: a person can read what produced any entry they find. An entry that
      // was not trusted is replaced here, never written into in place.
      write_atomic(stem.string() + ".cu", src.source, entry_mode(shared));
      write_atomic(entry, serialize(r.binary), entry_mode(shared));
    } catch (const Error& e) {
      write_failed(e.what());
    }
  }
  key_lock.reset();
  if (write_ok && options_.max_bytes > 0) enforce_cap(entry);
  result.binary = std::move(r.binary);
  result.on_disk = write_ok;
  if (!write_ok) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.not_stored;
    result.not_stored_why = unusable_why_;
  }
  return result;
}

uint64_t DiskCache::size_bytes() const {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.extension() != ".kernel" && p.extension() != ".cu") continue;
    std::error_code size_ec;
    const auto n = fs::file_size(p, size_ec);
    if (!size_ec) total += n;
  }
  return total;
}

void DiskCache::enforce_cap(const fs::path& keep) {
  struct Entry {
    fs::path kernel;
    fs::file_time_type mtime;
    uint64_t bytes;
  };
  std::vector<Entry> found;
  uint64_t total = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    std::error_code e2;
    if (p.extension() == ".kernel") {
      Entry x{p, fs::last_write_time(p, e2), 0};
      if (e2) continue;
      x.bytes = fs::file_size(p, e2);
      const auto cu = fs::file_size(sibling(p, ".cu"), e2);
      if (!e2) x.bytes += cu;
      total += x.bytes;
      found.push_back(std::move(x));
    } else if (p.filename().string().find(".tmp.") != std::string::npos) {
      // A writer killed mid-write leaves its temp file; nothing ever renames it after 10 minutes.
      const auto t = fs::last_write_time(p, e2);
      if (!e2 && now - t > std::chrono::minutes(10)) fs::remove(p, e2);
    }
  }
  const uint64_t max_bytes = options_.max_bytes;
  if (total <= max_bytes) return;
  std::sort(found.begin(), found.end(), [](const Entry& a, const Entry& b) { return a.mtime < b.mtime; });
  for (const Entry& x : found) {
    if (total <= max_bytes) break;
    if (x.kernel == keep) continue;
    // Never evict a key that is being compiled or read under its lock right now.
    const fs::path lock_path = sibling(x.kernel, ".lock");
    FileLock lock = FileLock::acquire(lock_path, false, entry_mode(options_.shared));
    if (!lock.ok()) continue;
    std::error_code e2;
    fs::remove(x.kernel, e2);
    fs::remove(sibling(x.kernel, ".cu"), e2);
    fs::remove(lock_path, e2);  // while held: a waiter on this inode re-checks and retries
    total -= x.bytes;
    std::lock_guard<std::mutex> guard(mutex_);
    ++counters_.evictions;
  }
  if (total > max_bytes)
    detail::log().warn("disk cache {} holds {} bytes, over NORMJIT_CACHE_MAX_BYTES={}: the rest is in use or newest",
                       dir_.string(), total, max_bytes);
}

namespace {

constexpr char kBundleMagic[8] = {'N', 'J', 'B', 'U', 'N', 'D', 'L', 'E'};
constexpr uint32_t kBundleVersion = 1;

uint64_t xxh64(const std::string& bytes) { return XXH64(bytes.data(), bytes.size(), 0); }

// The bundle's entries by file name, every one verified; throws naming the first problem.
std::map<std::string, std::string> read_bundle(const fs::path& path) {
  auto bad = [&](const std::string& why) {
    return Error(Status::kCacheError, "bundle " + path.string() + ": " + why);
  };
  std::string bytes;
  if (!read_file(path, bytes)) throw bad(std::string("cannot be read: ") + std::strerror(errno));
  constexpr size_t kHead = sizeof(kBundleMagic) + sizeof(uint32_t) + sizeof(uint64_t);
  if (bytes.size() < kHead || std::memcmp(bytes.data(), kBundleMagic, sizeof(kBundleMagic)) != 0)
    throw bad("not a normjit bundle (no NJBUNDLE magic)");
  uint32_t version;
  uint64_t manifest_size;
  std::memcpy(&version, bytes.data() + sizeof(kBundleMagic), sizeof(version));
  std::memcpy(&manifest_size, bytes.data() + sizeof(kBundleMagic) + sizeof(version), sizeof(manifest_size));
  if (version != kBundleVersion)
    throw bad("format version " + std::to_string(version) + ", expected " + std::to_string(kBundleVersion));
  if (manifest_size > bytes.size() - kHead) throw bad("truncated manifest");
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(bytes.substr(kHead, manifest_size));
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("manifest is not JSON: ") + e.what());
  }
  std::map<std::string, std::string> entries;
  size_t offset = kHead + manifest_size;
  try {
    for (const auto& e : manifest.at("entries")) {
      const std::string name = e.at("name").get<std::string>();
      const uint64_t size = e.at("bytes").get<uint64_t>();
      if (name.empty() || name.find('/') != std::string::npos || name.substr(name.size() < 7 ? 0 : name.size() - 7) != ".kernel")
        throw bad("entry name '" + name + "' is not a cache entry file name");
      if (size > bytes.size() - offset) throw bad("entry " + name + " is truncated");
      std::string entry = bytes.substr(offset, size);
      offset += size;
      if (xxh64(entry) != e.at("xxh64").get<uint64_t>()) throw bad("entry " + name + ": checksum mismatch");
      Binary b;
      if (const std::string why = deserialize(entry, b); !why.empty()) throw bad("entry " + name + ": " + why);
      entries.emplace(name, std::move(entry));
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("manifest: ") + e.what());
  }
  if (offset != bytes.size()) throw bad(std::to_string(bytes.size() - offset) + " bytes after the last entry");
  return entries;
}

}  // namespace

void DiskCache::use_bundle(const fs::path& bundle) {
  auto entries = read_bundle(bundle);
  detail::log().info("bundle {}: {} entries", bundle.string(), entries.size());
  std::lock_guard<std::mutex> lock(mutex_);
  bundle_entries_ = std::move(entries);
}

size_t export_bundle(const fs::path& cache_dir, const fs::path& bundle, const std::vector<std::string>& names) {
  std::vector<std::string> chosen = names;
  if (chosen.empty()) {
    std::error_code ec;
    for (fs::directory_iterator it(cache_dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".kernel") chosen.push_back(it->path().filename().string());
    std::sort(chosen.begin(), chosen.end());
  }
  nlohmann::json list = nlohmann::json::array();
  std::string blobs;
  for (const std::string& name : chosen) {
    std::string entry;
    if (!read_file(cache_dir / name, entry))
      throw Error(Status::kCacheError, "cannot export " + (cache_dir / name).string() + ": cannot be read");
    Binary b;
    if (const std::string why = deserialize(entry, b); !why.empty())
      throw Error(Status::kCacheError, "cannot export " + (cache_dir / name).string() + ": " + why);
    list.push_back({{"name", name}, {"spec", name.substr(0, name.rfind(".sm_"))},
                    {"arch", b.arch}, {"bytes", entry.size()}, {"xxh64", xxh64(entry)}});
    blobs += entry;
  }
  const std::string manifest =
      nlohmann::json{{"format", "normjit-bundle"}, {"normjit", version()}, {"entries", list}}.dump();
  std::string out(kBundleMagic, sizeof(kBundleMagic));
  const uint32_t v = kBundleVersion;
  const uint64_t size = manifest.size();
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
  out.append(reinterpret_cast<const char*>(&size), sizeof(size));
  out += manifest;
  out += blobs;
  write_atomic(bundle, out);
  return chosen.size();
}

size_t import_bundle(const fs::path& bundle, const fs::path& cache_dir) {
  const auto entries = read_bundle(bundle);  // all verified before anything is written
  const bool shared = shared_from_env();
  if (std::string why = make_dirs(cache_dir, dir_mode(shared)); !why.empty()) throw Error(Status::kCacheError, why);
  struct stat st {};
  if (::stat(cache_dir.c_str(), &st) != 0)
    throw Error(Status::kCacheError, "cannot use cache directory " + cache_dir.string() + ": " + std::strerror(errno));
  if (const Distrust d = distrust_dir(cache_dir, st, shared); !d.empty())
    throw Error(Status::kCacheError, "cannot import into disk cache directory " + cache_dir.string() +
                                         ", it is not trusted: " + d.why + ". Fix: " + d.fix);
  for (const auto& [name, bytes] : entries) write_atomic(cache_dir / name, bytes, entry_mode(shared));
  return entries.size();
}

}  // namespace normjit
