// NORMJIT_HOST_DEVICE: the qualifier of the plain functions that the kernels and the host code
// (runtime/, tests/) both compile (block_scale_layout.h, e2m1.h). Include it as those headers do:
// by "normjit/host_device.h" under NVRTC (the embedded headers go by their names under
// templates/, and NVRTC looks nowhere else) and by "host_device.h", beside the including header,
// in host C++ (whose include path need not hold templates/).
#pragma once

#ifndef NORMJIT_HOST_DEVICE
#if defined(__CUDACC__)
#define NORMJIT_HOST_DEVICE __host__ __device__
#else
#define NORMJIT_HOST_DEVICE
#endif
#endif
