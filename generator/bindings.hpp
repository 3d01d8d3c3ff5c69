#pragma once
// What the generated sources name for a dtype and an epilogue: shared by the specialized and the
// generic kernels' generators.
#include "normjit/spec.hpp"

namespace normjit::detail {

const char* device_type(DType d);  // "f32", "f16", "bf16" (normjit:: element types)
struct EpilogueBinding {
  const char* header;   // templates/normjit/...
  const char* functor;  // normjit::...
};
EpilogueBinding epilogue_binding(Epilogue e);

}  // namespace normjit::detail
