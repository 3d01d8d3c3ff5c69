#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "generator/embedded.hpp"
#include "normjit/normjit.hpp"
#include "tests/runtime/cache_test_util.hpp"

using namespace normjit;
namespace fs = std::filesystem;

using namespace cache_test;

TEST_CASE("disk cache: miss compiles, hit loads, source kept beside the cubin") {
  const fs::path dir = fresh_dir("hits");
  const Spec spec = resolve(Spec::parse("layernorm.fwd_train.bf16.w_bf16.n768.bias"));
  Binary first, second;
  {
    DiskCache cache(dir);
    double ms = -1;
    first = cache.get_or_compile(spec, Target{90}, &ms);
    CHECK(ms > 0);
    CHECK(cache.counters().compiles == 1);
    CHECK(cache.counters().disk_hits == 0);
    second = cache.get_or_compile(spec, Target{90}, &ms);
    CHECK(ms == 0);
    CHECK(cache.counters().compiles == 1);
    CHECK(cache.counters().disk_hits == 1);
  }
  CHECK(first.image == second.image);
  CHECK(first.kernel_name == second.kernel_name);
  const auto kernels = entries(dir, ".kernel");
  const auto sources = entries(dir, ".cu");
  REQUIRE(kernels.size() == 1);
  REQUIRE(sources.size() == 1);
  CHECK(kernels[0].filename().string().rfind(spec.str() + ".sm_90.", 0) == 0);
  CHECK(slurp(sources[0]) == generate(spec).source);
  // No temp files are left behind.
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().string().find(".tmp.") == std::string::npos);

  // A fresh cache object (as in a new process) finds it without NVRTC.
  DiskCache again(dir);
  again.get_or_compile(spec, Target{90});
  CHECK(again.counters().disk_hits == 1);
  CHECK(again.counters().compiles == 0);

  // Another arch is another entry.
  again.get_or_compile(spec, Target{80});
  CHECK(again.counters().compiles == 1);
  CHECK(entries(dir, ".kernel").size() == 2);
  fs::remove_all(dir);
}

TEST_CASE("disk cache: lookup_batch compiles the misses together and stores each spec's entry") {
  const fs::path dir = fresh_dir("batch");
  std::vector<Spec> specs;
  for (const char* text : {"layernorm.fwd_train.bf16.w_bf16.n768.bias", "rmsnorm.fwd_infer.bf16.w_bf16.n2880",
                           "layernorm.fwd_infer.f16.w_f32.n5120.bias"})
    specs.push_back(resolve(Spec::parse(text)));
  {
    DiskCache cache(dir);
    cache.get_or_compile(specs[1], Target{90});  // already there: a hit in the batch
    const std::vector<DiskCache::Lookup> found = cache.lookup_batch(specs, Target{90});
    REQUIRE(found.size() == 3);
    CHECK(found[0].source == DiskCache::Lookup::Source::kCompiled);
    CHECK(found[1].source == DiskCache::Lookup::Source::kDisk);
    CHECK(found[2].source == DiskCache::Lookup::Source::kCompiled);
    for (const auto& f : found) CHECK(f.on_disk);
    CHECK(found[0].compile_ms > 0);
    CHECK(found[0].binary.image == found[2].binary.image);  // one program for both misses
    CHECK(cache.counters().compiles == 3);                   // the first lookup, then two entries
    CHECK(cache.counters().disk_hits == 1);
  }
  CHECK(entries(dir, ".kernel").size() == 3);
  // A fresh cache finds each spec's own entry, with its own kernel name, without NVRTC.
  DiskCache again(dir);
  for (const Spec& spec : specs) {
    CAPTURE(spec.str());
    const DiskCache::Lookup r = again.lookup(spec, Target{90});
    CHECK(r.source == DiskCache::Lookup::Source::kDisk);
    CHECK(r.binary.kernel_name == generate(spec).kernel_name);
  }
  CHECK(again.counters().compiles == 0);
  CHECK_THROWS_AS(again.lookup_batch({Spec::parse("rmsnorm.fwd_infer.bf16.n64")}, Target{90}), Error);
  fs::remove_all(dir);
}

TEST_CASE("disk cache key covers source, arch and options") {
  const GeneratedSource a = generate(resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096")));
  GeneratedSource b = a;
  b.source += "// changed\n";
  CHECK(DiskCache::key(a, Target{90}) == DiskCache::key(a, Target{90}));
  CHECK(DiskCache::key(a, Target{90}) != DiskCache::key(b, Target{90}));
  CHECK(DiskCache::key(a, Target{90}) != DiskCache::key(a, Target{80}));
}

TEST_CASE("the cache key's template digest is the SHA-256 of the embedded templates") {
  // The key takes the headers by a digest computed at build time (cmake/embed_templates.cmake); a
  // stale digest would let entries compiled from other templates load. Recompute it here from the
  // embedded files, the same concatenation, through `cmake -E sha256sum`.
  const fs::path file = fs::temp_directory_path() / ("normjit-digest-" + std::to_string(std::random_device{}()));
  {
    std::ofstream out(file, std::ios::binary);
    for (const auto& f : detail::embedded_templates())
      out << f.path << '\n' << f.contents.size() << '\n' << f.contents;
  }
  std::string printed;
  if (FILE* p = popen(("cmake -E sha256sum " + file.string()).c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) printed += buf;
    pclose(p);
  }
  fs::remove(file);
  REQUIRE(printed.size() >= 64);
  CHECK(printed.substr(0, 64) == std::string(detail::embedded_templates_digest()));
  CHECK(detail::embedded_templates().size() >= 7);
}

TEST_CASE("disk cache: corrupt, truncated and wrong-version entries are recompiled, never loaded") {
  const fs::path dir = fresh_dir("corrupt");
  const Spec spec = resolve(Spec::parse("rmsnorm.fwd_train.f16.w_f32.n1000"));
  const Binary good = DiskCache(dir).get_or_compile(spec, Target{90});
  const fs::path entry = entries(dir, ".kernel").at(0);
  const std::string bytes = slurp(entry);

  auto damaged = [&](const std::string& what, const std::string& content) {
    CAPTURE(what);
    std::ofstream(entry, std::ios::binary | std::ios::trunc) << content;
    DiskCache cache(dir);
    const Binary b = cache.get_or_compile(spec, Target{90});
    CHECK(cache.counters().corrupt_entries == 1);
    CHECK(cache.counters().compiles == 1);
    CHECK(b.image == good.image);
    CHECK(slurp(entry) == bytes);  // replaced by a good entry
  };
  damaged("truncated", bytes.substr(0, bytes.size() / 2));
  damaged("empty", "");
  std::string flipped = bytes;
  flipped[flipped.size() - 100] ^= 0x10;
  damaged("bit flip in the image", flipped);
  std::string version = bytes;
  version[8] = 99;  // format_version follows the 8-byte magic
  damaged("wrong format version", version);
  std::string magic = bytes;
  magic[0] = 'X';
  damaged("bad magic", magic);
  fs::remove_all(dir);
}

TEST_CASE("disk cache: an unusable directory degrades to no disk cache with the kernel still returned") {
  const fs::path blocker = fresh_dir("blocker");
  std::ofstream(blocker) << "a file where the cache directory should be";
  DiskCache cache(blocker / "sub");
  const Spec spec = resolve(Spec::parse("layernorm.fwd_infer.bf16.n64"));
  const Binary b = cache.get_or_compile(spec, Target{90});
  CHECK(!b.image.empty());
  CHECK(cache.counters().write_failures == 1);
  cache.get_or_compile(spec, Target{90});
  CHECK(cache.counters().compiles == 2);
  CHECK(cache.counters().write_failures == 1);  // warned once, then memory only
  fs::remove(blocker);
}

TEST_CASE("default cache dir follows NORMJIT_CACHE_DIR, then XDG_CACHE_HOME, then HOME") {
  const char* saved[3] = {std::getenv("NORMJIT_CACHE_DIR"), std::getenv("XDG_CACHE_HOME"), std::getenv("HOME")};
  const std::string keep[3] = {saved[0] ? saved[0] : "", saved[1] ? saved[1] : "", saved[2] ? saved[2] : ""};
  setenv("NORMJIT_CACHE_DIR", "/tmp/nj-a", 1);
  CHECK(DiskCache::default_dir() == fs::path("/tmp/nj-a"));
  unsetenv("NORMJIT_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/tmp/nj-x", 1);
  CHECK(DiskCache::default_dir() == fs::path("/tmp/nj-x/normjit"));
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/tmp/nj-h", 1);
  CHECK(DiskCache::default_dir() == fs::path("/tmp/nj-h/.cache/normjit"));
  const char* names[3] = {"NORMJIT_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  for (int i = 0; i < 3; ++i) {
    if (saved[i]) setenv(names[i], keep[i].c_str(), 1);
    else unsetenv(names[i]);
  }
}

TEST_CASE("a second process finds the cubins without calling NVRTC") {
  const fs::path dir = fresh_dir("procs");
  const fs::path json1 = dir.string() + "-1.json", json2 = dir.string() + "-2.json";
  const std::string base = std::string(NORMJIT_PRECOMPILE_EXE) + " -q --arch sm_90 --cache-dir " + dir.string() +
                           " layernorm.fwd_train.bf16.w_bf16.n4096 rmsnorm.fwd_infer.f16.w_f32.n127.bias --json ";
  REQUIRE(std::system((base + json1.string()).c_str()) == 0);
  REQUIRE(std::system((base + json2.string()).c_str()) == 0);
  const auto first = nlohmann::json::parse(slurp(json1));
  const auto second = nlohmann::json::parse(slurp(json2));
  CHECK(first["compiled"] == 2);
  CHECK(first["cached"] == 0);
  CHECK(second["compiled"] == 0);
  CHECK(second["cached"] == 2);
  CHECK(second["failed"] == 0);
  fs::remove_all(dir);
  fs::remove(json1);
  fs::remove(json2);
}
