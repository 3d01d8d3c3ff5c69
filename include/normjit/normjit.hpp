#pragma once
#include "normjit/compiler.hpp"
#include "normjit/driver.hpp"
#include "normjit/error.hpp"
#include "normjit/generic.hpp"
#include "normjit/runtime.hpp"
#include "normjit/spec.hpp"
#include "normjit/tuning.hpp"
