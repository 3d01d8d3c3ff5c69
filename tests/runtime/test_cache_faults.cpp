// The disk cache under crowds and faults: many processes cold-starting the same keys, writers
// killed mid-write, a full or read-only filesystem, and the LRU size cap.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "normjit/normjit.hpp"
#include "tests/runtime/cache_test_util.hpp"

using namespace normjit;
namespace fs = std::filesystem;

using namespace cache_test;

namespace {

// Small, fast-compiling and distinct: rmsnorm inference at N = first .. first + count - 1.
std::vector<std::string> small_specs(int first, int count) {
  std::vector<std::string> out;
  for (int n = first; n < first + count; ++n) out.push_back("rmsnorm.fwd_infer.bf16.w_bf16.n" + std::to_string(n));
  return out;
}

fs::path write_manifest(const fs::path& path, const std::vector<std::string>& specs) {
  std::ofstream out(path);
  for (const auto& s : specs) out << s << "\n";
  return path;
}

int run(const std::string& command) {
  const int status = std::system(("bash -c '" + command + "'").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Every .kernel in `dir` loads as a valid entry: a fresh cache over `specs` finds no corrupt entry.
void check_every_entry_valid(const fs::path& dir, const std::vector<std::string>& specs) {
  DiskCache cache(dir);
  for (const auto& s : specs) cache.get_or_compile(resolve(Spec::parse(s)), Target{90});
  const CacheCounters c = cache.counters();
  CHECK(c.corrupt_entries == 0);
  CHECK(c.disk_hits + c.compiles == specs.size());
}

}  // namespace

TEST_CASE("32 processes cold-start the same 50 specs: each compiled exactly once, every process succeeds") {
  const fs::path dir = fresh_dir("crowd");
  fs::create_directories(dir);
  const std::vector<std::string> specs = small_specs(1, 50);
  const fs::path manifest = write_manifest(dir / "manifest.txt", specs);
  const fs::path cache = dir / "cache";
  constexpr int kProcesses = 32;
  // Each process walks the manifest from a different start (rotated), so they collide on keys
  // rather than queue behind one another in the same order.
  std::string cmd;
  for (int p = 0; p < kProcesses; ++p) {
    const fs::path rotated = dir / ("m" + std::to_string(p) + ".txt");
    std::vector<std::string> r(specs.begin() + (p * 7) % 50, specs.end());
    r.insert(r.end(), specs.begin(), specs.begin() + (p * 7) % 50);
    write_manifest(rotated, r);
    cmd += std::string(NORMJIT_PRECOMPILE_EXE) + " -q -j 1 --arch sm_90 --cache-dir " + cache.string() +
           " --manifest " + rotated.string() + " --json " + (dir / ("p" + std::to_string(p) + ".json")).string() +
           " || echo $? > " + (dir / ("p" + std::to_string(p) + ".failed")).string() + " &\n";
  }
  cmd += "wait";
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(run(cmd) == 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t compiled = 0, cached = 0, waited = 0, succeeded = 0;
  for (int p = 0; p < kProcesses; ++p) {
    CAPTURE(p);
    CHECK_FALSE(fs::exists(dir / ("p" + std::to_string(p) + ".failed")));
    const fs::path json = dir / ("p" + std::to_string(p) + ".json");
    REQUIRE(fs::exists(json));
    const auto j = nlohmann::json::parse(slurp(json));
    CHECK(j["failed"] == 0);
    CHECK(j["compiled"].get<size_t>() + j["cached"].get<size_t>() == specs.size());
    compiled += j["compiled"].get<size_t>();
    cached += j["cached"].get<size_t>();
    waited += j["waited_for_another_compile"].get<size_t>();
    succeeded += j["failed"] == 0;
  }
  CHECK(succeeded == kProcesses);
  CHECK(compiled == specs.size());  // each key compiled by exactly one process
  CHECK(count_ext(cache, ".kernel") == specs.size());
  MESSAGE(kProcesses << " processes x " << specs.size() << " specs in " << seconds << " s: " << compiled
                     << " compiles in all, " << cached << " cache hits, " << waited
                     << " of them after waiting for another process's compile");
  fs::remove_all(dir);
}

TEST_CASE("writers killed with SIGKILL mid-run never leave an entry that loads wrong") {
  const fs::path dir = fresh_dir("sigkill");
  fs::create_directories(dir);
  const std::vector<std::string> specs = small_specs(100, 24);
  const fs::path manifest = write_manifest(dir / "manifest.txt", specs);
  const fs::path cache = dir / "cache";
  int killed = 0;
  for (int round = 0; round < 6; ++round) {
    // Two writers at once, killed after 30-330 ms: some mid-compile, some mid-write.
    const int delay_ms = 30 + 60 * round;
    const std::string p = std::string(NORMJIT_PRECOMPILE_EXE) + " -q -j 2 --arch sm_90 --cache-dir " + cache.string() +
                          " --manifest " + manifest.string();
    // The shell's own "Killed" notices go to /dev/null with the rest.
    const int rc = run("exec 2>/dev/null; " + p + " >/dev/null 2>&1 & a=$!; " + p + " >/dev/null 2>&1 & b=$!; sleep " +
                       std::to_string(delay_ms / 1000.0) + "; kill -9 $a $b 2>/dev/null; wait $a; ra=$?; wait $b; rb=$?; " +
                       "[ $ra -eq 137 ] || [ $rb -eq 137 ]");
    killed += rc == 0;
  }
  MESSAGE(killed << " of 6 rounds killed a writer mid-run; " << count_ext(cache, ".kernel") << " entries on disk");
  CHECK(killed > 0);
  check_every_entry_valid(cache, specs);
  fs::remove_all(dir);
}

namespace {

// What must hold when the disk fills up; returns the first violation, empty when all hold.
std::string fill_up(const fs::path& dir) {
  DiskCache cache(dir);
  for (const char* s : {"layernorm.fwd_train.bf16.w_bf16.n4096.bias", "rmsnorm.bwd.bf16.w_f32.n2048"}) {
    const Binary b = cache.get_or_compile(resolve(Spec::parse(s)), Target{90});
    if (b.image.size() < 1000) return std::string("no kernel returned for ") + s;
  }
  const CacheCounters c = cache.counters();
  if (c.write_failures != 1) return "write_failures=" + std::to_string(c.write_failures) + ", expected one warning";
  if (c.compiles != 2) return "compiles=" + std::to_string(c.compiles);
  if (count_ext(dir, ".kernel") != 0) return "a failed write left a .kernel entry";
  return {};
}

}  // namespace

TEST_CASE("a full filesystem and a read-only one: one warning, kernels still returned, no partial entry") {
  const fs::path full = fresh_dir("enospc");
  fs::create_directories(full);
  // A 12 KB tmpfs: the first .cu fits, no .kernel does (ENOSPC). Mode 0700: a tmpfs root is 1777
  // by default, which the cache would refuse before it wrote anything.
  const bool full_mounted = ::mount("tmpfs", full.c_str(), "tmpfs", 0, "size=12k,mode=0700") == 0;
  const std::string mount_error = std::strerror(errno);
  if (full_mounted) {
    CHECK(fill_up(full) == "");
    ::umount(full.c_str());
  } else {
    // Without mount permission: a 4 KB file-size limit fails the same writes (EFBIG), in a child.
    MESSAGE("no permission to mount a tmpfs (" << mount_error
                                               << "): simulating the full disk with RLIMIT_FSIZE instead");
    const pid_t child = ::fork();
    if (child == 0) {
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit limit{4096, 4096};
      ::setrlimit(RLIMIT_FSIZE, &limit);
      const std::string why = fill_up(full);
      if (!why.empty()) std::fprintf(stderr, "full disk: %s\n", why.c_str());
      std::_Exit(why.empty() ? 0 : 1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }

  // Read-only: a read-only tmpfs, or /proc (where not even root creates a directory).
  const fs::path ro = fresh_dir("readonly");
  fs::create_directories(ro);
  const bool mounted = ::mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=1m,mode=0700") == 0;
  {
    DiskCache cache(mounted ? ro : fs::path("/proc/normjit-cache"));
    const Binary b = cache.get_or_compile(resolve(Spec::parse("rmsnorm.fwd_infer.f16.n64")), Target{90});
    CHECK(!b.image.empty());
    CHECK(cache.counters().write_failures == 1);
    cache.get_or_compile(resolve(Spec::parse("rmsnorm.fwd_infer.f16.n128")), Target{90});
    CHECK(cache.counters().write_failures == 1);
    CHECK(cache.counters().compiles == 2);
  }
  if (mounted) ::umount(ro.c_str());
  fs::remove_all(full);
  fs::remove_all(ro);
}

TEST_CASE("size cap: least recently used entries go first; a hit refreshes an entry") {
  const fs::path dir = fresh_dir("lru");
  const std::vector<std::string> names = small_specs(200, 3);
  std::vector<Spec> specs;
  for (const auto& n : names) specs.push_back(resolve(Spec::parse(n)));
  DiskCache cache(dir);
  cache.get_or_compile(specs[0], Target{90});
  const uint64_t one = cache.size_bytes();
  cache.get_or_compile(specs[1], Target{90});
  REQUIRE(count_ext(dir, ".kernel") == 2);
  // Entry 0 was written an hour before entry 1; then a hit makes it the most recent.
  std::vector<fs::path> kernels;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".kernel") kernels.push_back(e.path());
  const auto now = fs::file_time_type::clock::now();
  for (const auto& k : kernels)
    fs::last_write_time(k, now - std::chrono::hours(k.string().find(".n200.") != std::string::npos ? 2 : 1));
  cache.set_max_bytes(one * 5 / 2);  // room for two entries, not three
  cache.get_or_compile(specs[0], Target{90});  // hit: entry 0 becomes the newest
  cache.get_or_compile(specs[2], Target{90});  // over the cap: entry 1, the least recent, goes
  CHECK(cache.counters().evictions == 1);
  CHECK(cache.size_bytes() <= cache.max_bytes());
  std::string left;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".kernel") left += e.path().filename().string() + " ";
  CAPTURE(left);
  CHECK(left.find(".n200.") != std::string::npos);
  CHECK(left.find(".n201.") == std::string::npos);
  CHECK(left.find(".n202.") != std::string::npos);
  // An evicted entry is simply compiled again.
  DiskCache again(dir);
  again.get_or_compile(specs[1], Target{90});
  CHECK(again.counters().compiles == 1);
  fs::remove_all(dir);
}

TEST_CASE("NORMJIT_CACHE_MAX_BYTES is read at construction; a bad value names itself") {
  setenv("NORMJIT_CACHE_MAX_BYTES", "123456", 1);
  CHECK(DiskCache("/tmp/normjit-cap").max_bytes() == 123456);
  setenv("NORMJIT_CACHE_MAX_BYTES", "12MB", 1);
  try {
    DiskCache bad("/tmp/normjit-cap");
    FAIL("a non-numeric cap was accepted");
  } catch (const Error& e) {
    CHECK(e.status() == Status::kInvalidArgument);
    CHECK(std::string(e.what()).find("NORMJIT_CACHE_MAX_BYTES='12MB'") != std::string::npos);
  }
  unsetenv("NORMJIT_CACHE_MAX_BYTES");
  CHECK(DiskCache("/tmp/normjit-cap").max_bytes() == 0);
}

TEST_CASE("bundles: two archs exported in one run, imported or used directly with no compile; damage is refused whole") {
  const fs::path dir = fresh_dir("bundle");
  const fs::path built = dir / "built", bundle = dir / "kernels.njb";
  const std::vector<std::string> specs = {"layernorm.fwd_train.bf16.w_f32.n4096.bias", "rmsnorm.bwd.f16.w_f16.n768",
                                          "adalayernorm.fwd_infer.f32.w_f32.n1000.bias.gelu"};
  std::string cmd = std::string(NORMJIT_PRECOMPILE_EXE) + " -q -a sm_80 -a sm_90 -c " + built.string() + " --bundle " +
                    bundle.string();
  for (const auto& s : specs) cmd += " " + s;
  REQUIRE(run(cmd) == 0);
  REQUIRE(fs::exists(bundle));

  // Imported into an empty cache: every kernel is a disk hit, for both archs.
  const fs::path imported = dir / "imported";
  REQUIRE(run(std::string(NORMJIT_PRECOMPILE_EXE) + " --import " + bundle.string() + " -c " + imported.string()) == 0);
  CHECK(count_ext(imported, ".kernel") == 2 * specs.size());
  {
    DiskCache cache(imported);
    for (const auto& s : specs)
      for (int arch : {80, 90}) cache.get_or_compile(resolve(Spec::parse(s), 16, arch), Target{arch});
    CHECK(cache.counters().compiles == 0);
    CHECK(cache.counters().disk_hits == 2 * specs.size());
  }
  // Used directly: an empty directory, the bundle as the only source.
  {
    DiskCache cache(dir / "empty");
    cache.use_bundle(bundle);
    for (const auto& s : specs) {
      const Binary b = cache.get_or_compile(resolve(Spec::parse(s)), Target{90});
      CHECK(b.image.size() > 1000);
    }
    CHECK(cache.counters().compiles == 0);
    CHECK_FALSE(fs::exists(dir / "empty"));  // nothing written
  }
  // Damage anywhere: the bundle is refused with its name and the reason, and nothing is imported.
  const std::string good = slurp(bundle);
  auto refused = [&](const std::string& what, const std::string& bytes, const std::string& needle) {
    CAPTURE(what);
    const fs::path bad = dir / "bad.njb", target = dir / ("target-" + std::to_string(bytes.size()));
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
    try {
      import_bundle(bad, target);
      FAIL("a damaged bundle was imported");
    } catch (const Error& e) {
      CHECK(e.status() == Status::kCacheError);
      CHECK(std::string(e.what()).find(bad.string()) != std::string::npos);
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
    CHECK(count_ext(target, ".kernel") == 0);
  };
  std::string flipped = good;
  flipped[flipped.size() - 200] ^= 0x04;  // inside the last entry
  refused("bit flip in an entry", flipped, "checksum mismatch");
  refused("truncated", good.substr(0, good.size() - 10), "truncated");
  std::string magic = good;
  magic[0] = 'X';
  refused("bad magic", magic, "NJBUNDLE");
  std::string version = good;
  version[8] = 7;
  refused("wrong version", version, "format version 7");
  refused("trailing bytes", good + "junk", "bytes after the last entry");
  fs::remove_all(dir);
}
