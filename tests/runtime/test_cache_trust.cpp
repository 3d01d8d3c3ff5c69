// Who the disk cache trusts, and the precompile tool failing when it cannot store what it was asked
// to. An entry is code the process runs: only the user's own directory (or, opted in, its group's)
// and entries its owners wrote are loaded. The second user is `nobody`, through setpriv, which
// needs root: where that is not possible the subcase says so and is skipped.
#include <doctest/doctest.h>

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "normjit/normjit.hpp"
#include "tests/runtime/cache_test_util.hpp"

using namespace normjit;
namespace fs = std::filesystem;

using namespace cache_test;

namespace {

constexpr const char* kSpec = "rmsnorm.fwd_infer.f16.w_f16.n64";

struct Ran {
  int rc = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing its output.
Ran run_capture(const std::string& command) {
  const fs::path out = fresh_dir("output");
  const int status = std::system(("(" + command + ") >" + out.string() + " 2>&1").c_str());
  Ran r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out)};
  fs::remove(out);
  return r;
}

std::string precompile(const std::string& args) { return std::string(NORMJIT_PRECOMPILE_EXE) + " -q " + args; }

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

uid_t owner_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_uid;
}

// A command prefix that runs as nobody:nogroup, or empty with `why` set when this cannot.
std::string as_nobody(std::string& why) {
  if (::geteuid() != 0) {
    why = "not running as root (uid " + std::to_string(::geteuid()) + "): cannot act as a second user";
    return {};
  }
  if (!::getpwnam("nobody") || !::getgrnam("nogroup")) {
    why = "no user nobody or group nogroup on this machine";
    return {};
  }
  const std::string prefix = "setpriv --reuid=nobody --regid=nogroup --clear-groups ";
  const Ran probe = run_capture(prefix + std::string(NORMJIT_PRECOMPILE_EXE) + " --help");
  if (probe.rc != 0) {
    why = "cannot run the precompile tool as nobody through setpriv (rc " + std::to_string(probe.rc) +
          "): " + probe.output.substr(0, 200);
    return {};
  }
  return prefix;
}

// Sets an environment variable for a scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("precompile fails, naming the cause, when it cannot store its kernels or write its outputs") {
  const ScopedEnv no_shared("NORMJIT_CACHE_SHARED", nullptr);
  const fs::path dir = fresh_dir("unstorable");
  fs::create_directories(dir);
  const fs::path file = dir / "a-file";
  std::ofstream(file) << "not a directory";

  SUBCASE("the cache directory is a regular file") {
    const Ran r = run_capture(precompile("-c " + file.string() + " " + kSpec));
    CHECK(r.rc != 0);
    CHECK_MESSAGE(r.output.find("1 of 1 kernel(s) could not be stored in cache " + file.string()) != std::string::npos,
                  r.output);
    CHECK_MESSAGE(r.output.find("is not a directory") != std::string::npos, r.output);
  }
  SUBCASE("the cache directory cannot be created (a path under a file)") {
    const fs::path under = file / "cache";
    const Ran r = run_capture(precompile("-c " + under.string() + " " + kSpec));
    CHECK(r.rc != 0);
    CHECK_MESSAGE(r.output.find("could not be stored in cache " + under.string()) != std::string::npos, r.output);
    CHECK_MESSAGE(r.output.find("Not a directory") != std::string::npos, r.output);  // the OS error
  }
  SUBCASE("--json, --bundle and --import that cannot be written") {
    const fs::path cache = dir / "cache";
    Ran r = run_capture(precompile("-c " + cache.string() + " --json " + (file / "out.json").string() + " " + kSpec));
    CHECK(r.rc != 0);
    CHECK_MESSAGE(r.output.find("--json: cannot create " + (file / "out.json").string()) != std::string::npos, r.output);

    r = run_capture(precompile("-c " + cache.string() + " --bundle " + (file / "k.njb").string() + " " + kSpec));
    CHECK(r.rc != 0);
    CHECK_MESSAGE(r.output.find("cannot create " + (file / "k.njb").string()) != std::string::npos, r.output);
    CHECK_FALSE(fs::exists(file / "k.njb"));

    const fs::path bundle = dir / "k.njb";
    REQUIRE(run_capture(precompile("-c " + cache.string() + " --bundle " + bundle.string() + " " + kSpec)).rc == 0);
    r = run_capture(std::string(NORMJIT_PRECOMPILE_EXE) + " --import " + bundle.string() + " -c " +
                    (file / "cache").string());
    CHECK(r.rc != 0);
    CHECK_MESSAGE(r.output.find("cannot create cache directory " + (file / "cache").string()) != std::string::npos,
                  r.output);
    r = run_capture(std::string(NORMJIT_PRECOMPILE_EXE) + " --import " + bundle.string() + " -c " + file.string());
    CHECK(r.rc != 0);
    CHECK_MESSAGE(r.output.find("is not a directory") != std::string::npos, r.output);
  }
  fs::remove_all(dir);
}

TEST_CASE("cache directories are created private and entries 0600, whatever the umask; shared: 02770 and 0660") {
  const fs::path dir = fresh_dir("modes");
  const mode_t saved = ::umask(0);  // the widest umask: the modes must not follow it
  {
    const ScopedEnv env("NORMJIT_CACHE_SHARED", nullptr);
    DiskCache cache(dir / "private" / "inner");
    CHECK(cache.lookup(resolve(Spec::parse(kSpec)), Target{90}).on_disk);
  }
  {
    const ScopedEnv env("NORMJIT_CACHE_SHARED", "1");
    DiskCache cache(dir / "shared");
    CHECK(cache.shared());
    CHECK(cache.lookup(resolve(Spec::parse(kSpec)), Target{90}).on_disk);
  }
  ::umask(saved);
  CHECK(mode_of(dir) == 0700);  // a parent the cache created
  CHECK(mode_of(dir / "private" / "inner") == 0700);
  for (const char* ext : {".kernel", ".cu", ".lock"}) {
    CAPTURE(ext);
    REQUIRE(count_ext(dir / "private" / "inner", ext) == 1);
    CHECK(mode_of(entries(dir / "private" / "inner", ext)[0]) == 0600);
    REQUIRE(count_ext(dir / "shared", ext) == 1);
    CHECK(mode_of(entries(dir / "shared", ext)[0]) == 0660);
  }
  CHECK(mode_of(dir / "shared") == 02770);

  // A parent that exists keeps its mode.
  fs::create_directories(dir / "open");
  fs::permissions(dir / "open", fs::perms(0755));
  DiskCache(dir / "open" / "cache").get_or_compile(resolve(Spec::parse(kSpec)), Target{90});
  CHECK(mode_of(dir / "open") == 0755);
  CHECK(mode_of(dir / "open" / "cache") == 0700);
  fs::remove_all(dir);
}

TEST_CASE("NORMJIT_CACHE_SHARED: 0 or 1; another value names itself") {
  {
    const ScopedEnv env("NORMJIT_CACHE_SHARED", "0");
    CHECK_FALSE(DiskCache("/tmp/normjit-shared-flag").shared());
  }
  const ScopedEnv env("NORMJIT_CACHE_SHARED", "yes");
  try {
    DiskCache bad("/tmp/normjit-shared-flag");
    FAIL("NORMJIT_CACHE_SHARED=yes was accepted");
  } catch (const Error& e) {
    CHECK(e.status() == Status::kInvalidArgument);
    CHECK(std::string(e.what()).find("NORMJIT_CACHE_SHARED='yes'") != std::string::npos);
  }
}

TEST_CASE("a directory others can write is refused: nothing loaded or stored, the runtime carries on in memory") {
  const ScopedEnv no_shared("NORMJIT_CACHE_SHARED", nullptr);
  const fs::path dir = fresh_dir("open-dir");
  const Spec spec = resolve(Spec::parse(kSpec));
  // A valid entry of this user's, then the directory opened to everyone.
  REQUIRE(DiskCache(dir).lookup(spec, Target{90}).on_disk);
  const auto before = fs::last_write_time(entries(dir, ".kernel").at(0));
  for (const mode_t open_mode : {mode_t(0777), mode_t(0770), mode_t(01777)}) {
    CAPTURE(open_mode);
    REQUIRE(::chmod(dir.c_str(), open_mode) == 0);
    DiskCache cache(dir);
    const DiskCache::Lookup r = cache.lookup(spec, Target{90});
    CHECK(r.source == DiskCache::Lookup::Source::kCompiled);  // not a hit, though the entry is valid
    CHECK_FALSE(r.binary.image.empty());
    CHECK_FALSE(r.on_disk);
    CHECK(r.not_stored_why.find("disk cache directory " + dir.string() + " is not trusted") != std::string::npos);
    CHECK(r.not_stored_why.find("chmod 700 " + dir.string()) != std::string::npos);
    const CacheCounters c = cache.counters();
    CHECK(c.untrusted_directory == 1);
    CHECK(c.disk_hits == 0);
    CHECK(c.not_stored == 1);
    CHECK(fs::last_write_time(entries(dir, ".kernel").at(0)) == before);  // not written either
  }
  // The precompile tool fails there, with the error and the fix.
  const Ran r = run_capture(precompile("-c " + dir.string() + " " + kSpec));
  CHECK(r.rc != 0);
  CHECK_MESSAGE(r.output.find("is not trusted: its mode 1777 lets other users write") != std::string::npos, r.output);
  CHECK_MESSAGE(r.output.find("Fix: chmod 700 " + dir.string()) != std::string::npos, r.output);
  CHECK_MESSAGE(r.output.find("NORMJIT_CACHE_SHARED=1") != std::string::npos, r.output);
  // A bundle cannot be imported there either.
  const fs::path bundle = dir.string() + ".njb";
  REQUIRE(run_capture(precompile("-c " + (dir.string() + "-ok") + " --bundle " + bundle.string() + " " + kSpec)).rc == 0);
  const Ran imported = run_capture(std::string(NORMJIT_PRECOMPILE_EXE) + " --import " + bundle.string() + " -c " + dir.string());
  CHECK(imported.rc != 0);
  CHECK_MESSAGE(imported.output.find("is not trusted") != std::string::npos, imported.output);

  // Made private again: a hit as before.
  REQUIRE(::chmod(dir.c_str(), 0700) == 0);
  DiskCache cache(dir);
  CHECK(cache.lookup(spec, Target{90}).source == DiskCache::Lookup::Source::kDisk);
  CHECK(cache.counters().untrusted_directory == 0);
  fs::remove_all(dir);
  fs::remove_all(dir.string() + "-ok");
  fs::remove(bundle);
}

TEST_CASE("an entry of this user's that others can write is not loaded, and is replaced whole") {
  const ScopedEnv no_shared("NORMJIT_CACHE_SHARED", nullptr);
  const fs::path dir = fresh_dir("open-entry");
  const Spec spec = resolve(Spec::parse(kSpec));
  REQUIRE(DiskCache(dir).lookup(spec, Target{90}).on_disk);
  const fs::path entry = entries(dir, ".kernel").at(0);
  for (const mode_t open_mode : {mode_t(0666), mode_t(0620)}) {
    CAPTURE(open_mode);
    REQUIRE(::chmod(entry.c_str(), open_mode) == 0);
    DiskCache cache(dir);
    const DiskCache::Lookup r = cache.lookup(spec, Target{90});
    CHECK(r.source == DiskCache::Lookup::Source::kCompiled);
    CHECK(cache.counters().untrusted_entries == 1);
    CHECK(r.on_disk);
    CHECK(mode_of(entry) == 0600);  // a new file renamed into place
    CHECK(DiskCache(dir).lookup(spec, Target{90}).source == DiskCache::Lookup::Source::kDisk);
  }
  fs::remove_all(dir);
}

TEST_CASE("entries written by another user are never loaded; a shared cache opted in accepts its group's") {
  const ScopedEnv no_shared("NORMJIT_CACHE_SHARED", nullptr);
  std::string why;
  const std::string nobody = as_nobody(why);
  if (nobody.empty()) {
    MESSAGE("SKIPPED (second-user cases): " << why);
    return;
  }
  const fs::path dir = fresh_dir("second-user");
  fs::create_directories(dir);
  REQUIRE(::chmod(dir.c_str(), 0777) == 0);
  const fs::path cache = dir / "cache";
  const Spec spec = resolve(Spec::parse(kSpec));
  const uid_t nobody_uid = ::getpwnam("nobody")->pw_uid;
  const gid_t nogroup = ::getgrnam("nogroup")->gr_gid;

  SUBCASE("a world-writable directory holding another user's entry") {
    // nobody fills a cache of its own, which it then opens to everyone.
    const Ran filled = run_capture(nobody + precompile("-c " + cache.string() + " " + kSpec + "; chmod 777 " + cache.string()));
    REQUIRE_MESSAGE(filled.rc == 0, filled.output);
    REQUIRE(count_ext(cache, ".kernel") == 1);
    REQUIRE(owner_of(entries(cache, ".kernel")[0]) == nobody_uid);
    DiskCache c(cache);
    const DiskCache::Lookup r = c.lookup(spec, Target{90});
    CHECK(r.source == DiskCache::Lookup::Source::kCompiled);
    CHECK(c.counters().disk_hits == 0);
    CHECK(c.counters().untrusted_directory == 1);
    const Ran root_run = run_capture(precompile("-c " + cache.string() + " " + kSpec));
    CHECK(root_run.rc != 0);
    CHECK_MESSAGE(root_run.output.find("is not trusted") != std::string::npos, root_run.output);
  }
  SUBCASE("this user's private directory holding another user's entry") {
    const Ran filled = run_capture(nobody + precompile("-c " + cache.string() + " " + kSpec));
    REQUIRE_MESSAGE(filled.rc == 0, filled.output);
    const fs::path entry = entries(cache, ".kernel").at(0);
    REQUIRE(owner_of(entry) == nobody_uid);
    REQUIRE(::chown(cache.c_str(), ::geteuid(), ::getegid()) == 0);  // the directory is this user's, 0700
    DiskCache c(cache);
    const DiskCache::Lookup r = c.lookup(spec, Target{90});
    CHECK(r.source == DiskCache::Lookup::Source::kCompiled);
    CHECK(c.counters().untrusted_entries == 1);
    CHECK(c.counters().untrusted_directory == 0);
    CHECK(r.on_disk);  // replaced by this user's own entry, renamed into place
    CHECK(owner_of(entry) == ::geteuid());
    DiskCache again(cache);
    CHECK(again.lookup(spec, Target{90}).source == DiskCache::Lookup::Source::kDisk);
  }
  SUBCASE("opted in: a group-writable directory and the group's entries") {
    fs::create_directories(cache);
    REQUIRE(::chown(cache.c_str(), ::geteuid(), nogroup) == 0);
    REQUIRE(::chmod(cache.c_str(), 02770) == 0);
    const Ran filled = run_capture("NORMJIT_CACHE_SHARED=1 " + nobody + precompile("-c " + cache.string() + " " + kSpec));
    REQUIRE_MESSAGE(filled.rc == 0, filled.output);
    const fs::path entry = entries(cache, ".kernel").at(0);
    CHECK(owner_of(entry) == nobody_uid);
    CHECK(mode_of(entry) == 0660);
    {
      DiskCacheOptions shared;
      shared.shared = true;
      DiskCache c(cache, shared);
      CHECK(c.lookup(spec, Target{90}).source == DiskCache::Lookup::Source::kDisk);
      CHECK(c.counters().compiles == 0);
    }
    {
      // Not opted in: the same directory is refused for its group write bit.
      DiskCache c(cache);
      CHECK(c.lookup(spec, Target{90}).source == DiskCache::Lookup::Source::kCompiled);
      CHECK(c.counters().untrusted_directory == 1);
    }
    {
      // Opted in, but world-writable: refused.
      REQUIRE(::chmod(cache.c_str(), 02777) == 0);
      DiskCacheOptions shared;
      shared.shared = true;
      DiskCache c(cache, shared);
      const DiskCache::Lookup r = c.lookup(spec, Target{90});
      CHECK(r.source == DiskCache::Lookup::Source::kCompiled);
      CHECK(r.not_stored_why.find("chmod 2770 " + cache.string()) != std::string::npos);
    }
  }
  fs::remove_all(dir);
}
