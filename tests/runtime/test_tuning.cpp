// The tuner's search space and its database, on the CPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "normjit/normjit.hpp"

using namespace normjit;

TEST_CASE("candidate configs: the heuristic's first, all valid, distinct, bounded; clusters only from sm_90") {
  for (const char* text : {"layernorm.fwd_train.bf16.w_f32.n4096.bias", "rmsnorm.fwd_infer.f16.w_f16.n7",
                           "rmsnorm.bwd.bf16.w_f32.n16384", "adalayernorm.bwd.f32.w_f32.n768.bias.relu_bitmask",
                           "layernorm.fwd_train.bf16.w_bf16.n65536.bias.gelu", "rmsnorm.fwd_train.f16.w_f16.n20001",
                           "layernorm.fwd_infer.f32.w_f32.n262144"}) {
    const Spec spec = Spec::parse(text);
    const std::string name = text;
    for (int sm : {80, 90}) {
      CAPTURE(name);
      CAPTURE(sm);
      const std::vector<BlockConfig> c = candidate_configs(spec, sm);
      REQUIRE(!c.empty());
      CHECK(c.front() == *resolve(spec, 16, sm).block);
      CHECK(c.size() <= 48);
      bool clustered = false;
      for (size_t i = 0; i < c.size(); ++i) {
        Spec s = spec;
        s.block = c[i];
        CHECK_NOTHROW(validate(s));
        CHECK(std::count(c.begin(), c.end(), c[i]) == 1);
        clustered |= c[i].cluster > 1;
      }
      if (sm < 90) CHECK_FALSE(clustered);
      if (sm >= 90 && spec.n >= 16384 && spec.n % 2 == 0) CHECK(clustered);  // a cluster splits whole packs
      // Narrower pointers: no candidate is wider than they allow.
      for (const BlockConfig& b : candidate_configs(spec, sm, 2)) CHECK(b.vec <= 2);
    }
  }
}

TEST_CASE("every candidate of a spec compiles for sm_90") {
  size_t compiled = 0;
  for (const char* text : {"layernorm.fwd_train.bf16.w_f32.n5120.bias", "rmsnorm.bwd.bf16.w_f32.n12288"}) {
    const Spec spec = Spec::parse(text);
    for (const BlockConfig& b : candidate_configs(spec, 90, 16, 24)) {
      Spec s = spec;
      s.block = b;
      CAPTURE(s.str());
      CHECK_NOTHROW(compile(generate(s), Target{90}));
      ++compiled;
    }
  }
  MESSAGE(compiled << " candidate configurations compiled");
}

namespace {

TuningKey key(const std::string& spec, const std::string& device = "GPU A") {
  return TuningKey{device, 90, 132, 13000, 13000, "0.1.0", Spec::parse(spec).str()};
}

TuningEntry entry(const std::string& spec, const std::string& cfg, double us) {
  TuningEntry e;
  e.config = *Spec::parse(spec + ".cfg_" + cfg).block;
  e.us = us;
  e.heuristic_us = us * 1.1;
  e.rows = 32768;
  return e;
}

}  // namespace

TEST_CASE("tuning database: the faster entry wins; merges agree in any order; save and load round-trip") {
  const std::string a = "layernorm.fwd_train.bf16.w_bf16.n4096.bias", b = "rmsnorm.bwd.bf16.w_f32.n8192";
  std::vector<std::pair<TuningKey, TuningEntry>> all = {
      {key(a), entry(a, "t128_r1_v8_reg", 10.0)},  {key(a), entry(a, "t256_r1_v8_reg", 9.0)},
      {key(a), entry(a, "t512_r1_v8_reg", 9.0)},   {key(a, "GPU B"), entry(a, "t64_r1_v8_reg", 12.0)},
      {key(b), entry(b, "t512_r1_v8_reg", 30.0)},  {key(b), entry(b, "t256_r1_v8_reg", 31.0)},
      {key(b, "GPU B"), entry(b, "t1024_r1_v8_gmem", 40.0)}};
  TuningDb one;
  for (const auto& [k, e] : all) one.record(k, e);
  CHECK(one.size() == 4);  // one winner per (device, versions, spec)
  // Ties go to the smaller config string: t256 < t512.
  CHECK(one.lookup(key(a))->config == entry(a, "t256_r1_v8_reg", 0).config);
  CHECK(one.lookup(key(b))->us == 30.0);
  CHECK_FALSE(one.lookup(key(a, "GPU C")).has_value());
  // Split over three "ranks" and merged in every order: the same bytes.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 10; ++trial) {
    std::shuffle(all.begin(), all.end(), rng);
    TuningDb parts[3];
    for (size_t i = 0; i < all.size(); ++i) parts[i % 3].record(all[i].first, all[i].second);
    int order[3] = {0, 1, 2};
    do {
      TuningDb merged;
      for (int i : order) merged.merge(parts[i]);
      CHECK(merged.dump() == one.dump());
    } while (std::next_permutation(order, order + 3));
  }
  const std::string path = (std::filesystem::temp_directory_path() / "normjit-tuning-test.json").string();
  one.save(path);
  CHECK(TuningDb::load(path).dump() == one.dump());
  std::filesystem::remove(path);
}

TEST_CASE("tuning database: bad files are rejected with the file and the reason") {
  struct Bad {
    const char* text;
    const char* needle;
  };
  const Bad bad[] = {
      {"not json", "not JSON"},
      {"[]", "\"format\""},
      {R"({"format": "other", "version": 1, "entries": []})", "\"format\""},
      {R"({"format": "normjit-tuning-db", "version": 2, "entries": []})", "\"version\" must be 1"},
      {R"({"format": "normjit-tuning-db", "version": 1, "entries": {}})", "\"entries\" must be an array"},
      {R"({"format": "normjit-tuning-db", "version": 1, "entries": [{"device": "x"}]})", "entry 0"},
      {R"({"format": "normjit-tuning-db", "version": 1, "entries": [{"device": "x", "sm": 90, "sm_count": 1,
          "driver": 1, "nvrtc": 1, "normjit": "v", "spec": "rmsnorm.fwd_infer.f16.n64", "config": "t3_r1_v8_reg",
          "us": 1.0}]})", "threads_per_row=3"},
      {R"({"format": "normjit-tuning-db", "version": 1, "entries": [{"device": "x", "sm": 90, "sm_count": 1,
          "driver": 1, "nvrtc": 1, "normjit": "v", "spec": "rmsnorm.fwd_infer.f16.n64", "config": "t8_r32_v8_reg",
          "us": -1.0}]})", "positive time"},
      // Found by fuzz_tuning_db: a float where an int goes converted with undefined behaviour.
      {R"({"format": "normjit-tuning-db", "version": 1, "entries": [{"device": "x", "sm": 9e47, "sm_count": 1,
          "driver": 1, "nvrtc": 1, "normjit": "v", "spec": "rmsnorm.fwd_infer.f16.n64", "config": "t8_r32_v8_reg",
          "us": 1.0}]})", "\"sm\" must be an integer"},
      {R"({"format": "normjit-tuning-db", "version": 1, "entries": [{"device": "x", "sm": 90, "sm_count": 4294967296,
          "driver": 1, "nvrtc": 1, "normjit": "v", "spec": "rmsnorm.fwd_infer.f16.n64", "config": "t8_r32_v8_reg",
          "us": 1.0}]})", "\"sm_count\"=4294967296 is out of range"},
      {R"({"format": "normjit-tuning-db", "version": 1, "entries": [{"device": "x", "sm": 90, "sm_count": 1,
          "driver": 1, "nvrtc": 1, "normjit": "v", "spec": "rmsnorm.fwd_infer.f16.n64", "config": "t8_r32_v8_reg",
          "us": 1.0, "rows": -5}]})", "\"rows\"=-5 is out of range"},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.text);
    try {
      TuningDb::parse(b.text, "db.json");
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.status() == Status::kInvalidArgument);
      const std::string what = e.what();
      CHECK(what.find("db.json") != std::string::npos);
      CHECK(what.find(b.needle) != std::string::npos);
    }
  }
}

TEST_CASE("tuning mode: db by default when a database exists; NORMJIT_TUNING overrides; bad values name themselves") {
  unsetenv("NORMJIT_TUNING");
  CHECK(tuning_mode_from_env(true) == TuningMode::kDatabase);
  CHECK(tuning_mode_from_env(false) == TuningMode::kHeuristic);
  setenv("NORMJIT_TUNING", "heuristic", 1);
  CHECK(tuning_mode_from_env(true) == TuningMode::kHeuristic);
  setenv("NORMJIT_TUNING", "tune", 1);
  CHECK(tuning_mode_from_env(false) == TuningMode::kTuneOnMiss);
  setenv("NORMJIT_TUNING", "fast", 1);
  CHECK_THROWS_WITH_AS(tuning_mode_from_env(true), doctest::Contains("NORMJIT_TUNING='fast'"), Error);
  unsetenv("NORMJIT_TUNING");
}
