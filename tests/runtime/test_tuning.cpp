// The tuner's search space and its database, on the CPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <thread>

#include "normjit/normjit.hpp"

using namespace normjit;

TEST_CASE("candidate configs: the heuristic's first, all valid, distinct, bounded; clusters only from sm_90") {
  for (const char* text : {"layernorm.fwd_train.bf16.w_f32.n4096.bias", "rmsnorm.fwd_infer.f16.w_f16.n7",
                           "rmsnorm.bwd.bf16.w_f32.n16384", "adalayernorm.bwd.f32.w_f32.n768.bias.relu_bitmask",
                           "layernorm.fwd_train.bf16.w_bf16.n65536.bias.gelu", "rmsnorm.fwd_train.f16.w_f16.n20001",
                           "layernorm.fwd_infer.f32.w_f32.n262144", "rmsnorm.fwd_train.bf16.w_bf16.n8192.residual",
                           "layernorm.bwd.bf16.w_f32.n4096.bias.zero_centered.residual"}) {
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

TEST_CASE("candidate configs hold two- and three-buffer pipelined rows, bulk-copied from sm_90, with a producer warp in the backward") {
  for (const char* text : {"rmsnorm.bwd.bf16.w_f32.n8192", "rmsnorm.fwd_train.bf16.w_bf16.n8192"}) {
    const Spec spec = Spec::parse(text);
    const bool backward = spec.phase == Phase::kBackward;
    for (int sm : {80, 90}) {
      CAPTURE(text);
      CAPTURE(sm);
      int pipe2 = 0, pipe3 = 0, bulk2 = 0, bulk3 = 0, producer = 0;
      for (const BlockConfig& b : candidate_configs(spec, sm, 16, 400)) {
        if (b.cache != RowCache::kSharedPipelined) continue;
        if (b.producer_warp) {
          ++producer;
          CHECK(b.stages == 2);
          continue;
        }
        (b.bulk_copy ? (b.stages == 3 ? bulk3 : bulk2) : (b.stages == 3 ? pipe3 : pipe2)) += 1;
        CHECK(b.stages <= 3);
      }
      CHECK(pipe2 > 0);
      CHECK(pipe3 > 0);
      if (sm >= 90) {
        CHECK(bulk2 > 0);
        CHECK(bulk3 > 0);
      } else {
        CHECK(bulk2 + bulk3 == 0);
      }
      CHECK((producer > 0) == (sm >= 90 && backward));
    }
  }
}

TEST_CASE("candidate configs hold clusters of any count, sized so each CTA's segment takes whole packs a thread") {
  // LN 57352: 7169 packs; 5 CTAs of 736 threads take 2 packs a thread (1434 x 4 + 1433).
  const Spec spec = Spec::parse("layernorm.bwd.bf16.w_f32.n57352.bias");
  const std::vector<BlockConfig> c = candidate_configs(spec, 90, 16, 400);
  BlockConfig five{736, 1, 8, RowCache::kSharedPipelined, 5};
  five.bulk_copy = true;
  CHECK(std::count(c.begin(), c.end(), five) == 1);
  for (const BlockConfig& b : candidate_configs(spec, 80, 16, 400)) CHECK(b.cluster == 1);
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

// A candidate as search_candidates' callbacks see it, without a GPU.
struct Fake {
  int local = 0;  // bytes of local memory per thread
  double us = 1;
  bool verified = true;
  bool get_fails = false;   // both callbacks throw Error, as Runtime::get does for a config it cannot load
  bool time_fails = false;  // time_us throws Error, as a failing launch does
  int sleep_ms = 0;         // time_us takes this long (before throwing, if it does)
};

// Runs search_candidates over fakes (candidate i has i + 1 warps per row) and records the calls.
struct FakeSearch {
  std::vector<Fake> fakes;
  std::vector<BlockConfig> configs;
  std::vector<int> asked_local, asked_time;
  std::vector<std::string> notes;

  explicit FakeSearch(std::vector<Fake> f) : fakes(std::move(f)) {
    for (size_t i = 0; i < fakes.size(); ++i) configs.push_back(BlockConfig{32 * int(i + 1), 1, 8});
  }
  static int index(const BlockConfig& b) { return b.threads_per_row / 32 - 1; }
  CandidateSearch run(double budget_s = 0) {
    return search_candidates(
        configs, budget_s,
        [&](const BlockConfig& b) {
          asked_local.push_back(index(b));
          const Fake& f = fakes[index(b)];
          if (f.get_fails) throw Error(Status::kNotSupported, "no kernel " + std::to_string(index(b)));
          return f.local;
        },
        [&](const BlockConfig& b) {
          asked_time.push_back(index(b));
          const Fake& f = fakes[index(b)];
          std::this_thread::sleep_for(std::chrono::milliseconds(f.sleep_ms));
          if (f.get_fails) throw Error(Status::kNotSupported, "no kernel " + std::to_string(index(b)));
          if (f.time_fails) throw Error(Status::kCudaError, "launch " + std::to_string(index(b)) + " failed");
          return CandidateTime{f.us, f.verified};
        },
        [&](const BlockConfig& b, const char* what, const std::string& why) {
          notes.push_back(std::string(what) + " " + std::to_string(index(b)) + ": " + why);
        });
  }
};

}  // namespace

TEST_CASE("tuning search: the heuristic is timed even if it spills; later spills are pruned, errors skipped") {
  Fake spills_first, spills, no_kernel, unverified, fast, bad_launch, tie, slower;
  spills_first.local = 64;
  spills_first.us = 10;
  spills.local = 128;
  spills.us = 1;
  no_kernel.get_fails = true;
  unverified.us = 5;
  unverified.verified = false;
  fast.us = 8;
  bad_launch.time_fails = true;
  tie.us = 8;
  slower.us = 9;
  FakeSearch f({spills_first, spills, no_kernel, unverified, fast, bad_launch, tie, slower});
  const CandidateSearch r = f.run();
  REQUIRE(r.best.has_value());
  CHECK(*r.best == f.configs[4]);  // not 1 (pruned), 3 (unverified) or 6 (a tie: the earlier wins)
  CHECK(r.best_us == 8);
  CHECK(r.heuristic_us == 10);
  CHECK(r.timed == 5);  // 0, 3, 4, 6, 7
  CHECK(r.skipped == 2);
  CHECK(r.pruned == 1);
  CHECK(r.dropped == 0);
  CHECK(f.asked_local == std::vector<int>{1, 2, 3, 4, 5, 6, 7});  // the first is not asked
  CHECK(f.asked_time == std::vector<int>{0, 3, 4, 5, 6, 7});
  CHECK(f.notes == std::vector<std::string>{
                       "pruned 1: 128 bytes of local memory per thread",
                       "skipping 2: " + std::string(Error(Status::kNotSupported, "no kernel 2").what()),
                       "skipping 5: " + std::string(Error(Status::kCudaError, "launch 5 failed").what())});
}

TEST_CASE("tuning search: when the heuristic fails, the first candidate that runs is the baseline") {
  Fake no_kernel, spills, spills_too, ok;
  no_kernel.get_fails = true;
  spills.local = 32;
  spills.us = 7;
  spills.verified = false;
  spills_too.local = 16;
  ok.us = 9;
  FakeSearch f({no_kernel, spills, spills_too, ok});
  const CandidateSearch r = f.run();
  REQUIRE(r.best.has_value());
  CHECK(*r.best == f.configs[3]);
  CHECK(r.best_us == 9);
  CHECK(r.heuristic_us == 7);  // the baseline's time, although it failed verification
  CHECK(r.timed == 2);
  CHECK(r.skipped == 1);
  CHECK(r.pruned == 1);
  CHECK(f.asked_local == std::vector<int>{2, 3});
  CHECK(f.asked_time == std::vector<int>{0, 1, 3});
}

TEST_CASE("tuning search: no winner when nothing verifies or nothing runs; other exceptions propagate") {
  Fake unverified;
  unverified.us = 3;
  unverified.verified = false;
  FakeSearch none_verified({unverified, unverified});
  CandidateSearch r = none_verified.run();
  CHECK_FALSE(r.best.has_value());
  CHECK(r.best_us == 0);
  CHECK(r.heuristic_us == 3);
  CHECK(r.timed == 2);

  Fake broken;
  broken.get_fails = true;
  FakeSearch none_ran({broken, broken, broken});
  r = none_ran.run();
  CHECK_FALSE(r.best.has_value());
  CHECK(r.heuristic_us == 0);
  CHECK(r.timed == 0);
  CHECK(r.skipped == 3);
  CHECK(none_ran.notes.size() == 3);

  CHECK_THROWS_AS(search_candidates(
                      none_ran.configs, 0, [](const BlockConfig&) { return 0; },
                      [](const BlockConfig&) -> CandidateTime { throw std::runtime_error("not an Error"); },
                      [](const BlockConfig&, const char*, const std::string&) {}),
                  std::runtime_error);
}

TEST_CASE("tuning search: a spent budget stops the search, but only after a candidate was timed") {
  Fake slow;
  slow.sleep_ms = 2;
  slow.us = 4;
  {
    FakeSearch f({slow, slow, slow, slow});
    const CandidateSearch r = f.run(1e-6);
    REQUIRE(r.best.has_value());
    CHECK(*r.best == f.configs[0]);
    CHECK(r.heuristic_us == 4);
    CHECK(r.timed == 1);
    CHECK(r.dropped == 3);
    CHECK(f.asked_time == std::vector<int>{0});
    CHECK(f.asked_local.empty());
  }
  {
    // The heuristic fails after the budget is spent: the next candidate still runs as the baseline.
    Fake slow_failure = slow;
    slow_failure.time_fails = true;
    FakeSearch f({slow_failure, slow, slow, slow});
    const CandidateSearch r = f.run(1e-6);
    REQUIRE(r.best.has_value());
    CHECK(*r.best == f.configs[1]);
    CHECK(r.skipped == 1);
    CHECK(r.timed == 1);
    CHECK(r.dropped == 2);
    CHECK(f.asked_time == std::vector<int>{0, 1});
  }
  for (double no_limit : {0.0, -1.0, 60.0}) {
    CAPTURE(no_limit);
    FakeSearch f({slow, slow, slow, slow});
    const CandidateSearch r = f.run(no_limit);
    CHECK(r.timed == 4);
    CHECK(r.dropped == 0);
    CHECK(*r.best == f.configs[0]);  // all tie: the first
  }
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
