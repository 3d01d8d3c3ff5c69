#include <doctest/doctest.h>

#include "normjit/normjit.hpp"

using namespace normjit;

TEST_CASE("without a GPU the library loads, and only GPU work fails, saying so plainly") {
  std::string why;
  if (gpu_available(&why)) {
    MESSAGE("a GPU is present; the no-GPU error path is not exercised here");
    CHECK(why.empty());
    return;
  }
  CHECK(!why.empty());
  try {
    Runtime rt(0);
    FAIL("Runtime should need a GPU");
  } catch (const Error& e) {
    CHECK(e.status() == Status::kDriverUnavailable);
    const std::string what = e.what();
    CHECK(what.find("needs a GPU") != std::string::npos);
    CHECK(what.find(why) != std::string::npos);
  }
  CHECK_THROWS_AS(driver(), Error);
  // Compiling still works.
  CHECK_NOTHROW(compile(generate(resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n256"))), Target{90}));
}
