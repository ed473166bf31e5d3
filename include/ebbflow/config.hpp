// SPDX-License-Identifier: Apache-2.0
//! @file config.hpp
//! Macros shared by every header: the versioned namespace, host/device
//! annotations, feature detection of optional backends and error macros.
#pragma once

#include <ebbflow/version.hpp>

//! Opens `ebbflow::inline v0`: two copies of the headers with different ABI
//! versions cannot silently violate the ODR.
#define EBBFLOW_BEGIN_NAMESPACE \
  namespace ebbflow {           \
  inline namespace v0 {
//! Closes what EBBFLOW_BEGIN_NAMESPACE opened.
#define EBBFLOW_END_NAMESPACE \
  }                           \
  }

//! `__host__ __device__` under nvcc, nothing for a host compiler. Kernel
//! bodies are functors whose call operator carries this annotation.
#if defined(__CUDACC__)
#define EBBFLOW_HD __host__ __device__
//! 1 under nvcc (host and device passes), 0 for a host compiler.
#define EBBFLOW_DEVICE_COMPILER 1
#else
#define EBBFLOW_HD
//! 1 under nvcc (host and device passes), 0 for a host compiler.
#define EBBFLOW_DEVICE_COMPILER 0
#endif

// Optional backends: a header that needs one is only usable when its
// dependency's headers are on the include path.
#if defined(__has_include)
#if __has_include(<ucp/api/ucp.h>) && !defined(EBBFLOW_NO_UCX)
#define EBBFLOW_HAS_UCX 1
#endif
#if __has_include(<boost/asio.hpp>) && __has_include(<openssl/hmac.h>) && !defined(EBBFLOW_NO_ASIO)
#define EBBFLOW_HAS_ASIO 1
#endif
#if __has_include(<cuda_runtime_api.h>) && !defined(EBBFLOW_NO_CUDA)
#define EBBFLOW_HAS_CUDA 1
#endif
#if __has_include(<nccl.h>) && defined(EBBFLOW_HAS_CUDA) && !defined(EBBFLOW_NO_NCCL)
#define EBBFLOW_HAS_NCCL 1
#endif
#endif
#ifndef EBBFLOW_HAS_UCX
#define EBBFLOW_HAS_UCX 0
#endif
#ifndef EBBFLOW_HAS_ASIO
#define EBBFLOW_HAS_ASIO 0
#endif
#ifndef EBBFLOW_HAS_CUDA
#define EBBFLOW_HAS_CUDA 0
#endif
#ifndef EBBFLOW_HAS_NCCL
#define EBBFLOW_HAS_NCCL 0
#endif

// Clang's __has_feature, or 0 where the compiler has none (GCC 12).
#if defined(__has_feature)
#define EBBFLOW_DETAIL_HAS_FEATURE(x) __has_feature(x)
#else
#define EBBFLOW_DETAIL_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || EBBFLOW_DETAIL_HAS_FEATURE(address_sanitizer)
//! 1 when compiled with AddressSanitizer (GCC or Clang), else 0.
#define EBBFLOW_SANITIZE_ADDRESS 1
#else
//! 1 when compiled with AddressSanitizer (GCC or Clang), else 0.
#define EBBFLOW_SANITIZE_ADDRESS 0
#endif
#if defined(__SANITIZE_THREAD__) || EBBFLOW_DETAIL_HAS_FEATURE(thread_sanitizer)
//! 1 when compiled with ThreadSanitizer (GCC or Clang), else 0.
#define EBBFLOW_SANITIZE_THREAD 1
#else
//! 1 when compiled with ThreadSanitizer (GCC or Clang), else 0.
#define EBBFLOW_SANITIZE_THREAD 0
#endif

//! 1 when exceptions are enabled; EBBFLOW_THROW aborts otherwise.
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define EBBFLOW_EXCEPTIONS 1
#else
#define EBBFLOW_EXCEPTIONS 0
#endif

//! Throws `ex`, or aborts with a message under -fno-exceptions.
#if EBBFLOW_EXCEPTIONS
#define EBBFLOW_THROW(ex) throw ex
#else
#include <cstdio>
#include <cstdlib>
#define EBBFLOW_THROW(ex) (std::fprintf(stderr, "ebbflow: fatal error (exceptions disabled)\n"), std::abort())
#endif

//! Separate compilation (the `ebbflow::compiled` CMake target, which defines
//! EBBFLOW_SEPARATE_COMPILATION for its users): the elastic group over the
//! TCP store and UCX, the store itself and the planner's solver are compiled
//! once, into that library (its one translation unit includes
//! <ebbflow/impl/compiled.hpp>), and the headers declare them only, so a
//! training loop's translation unit parses and generates far less. Every
//! translation unit of a program uses the same mode. Without the macro,
//! ebbflow is header-only (the default). docs/packaging.md, "Faster rebuilds".
#if defined(EBBFLOW_SEPARATE_COMPILATION) && !defined(EBBFLOW_COMPILING_LIBRARY)
#define EBBFLOW_HEADER_ONLY 0
#else
#define EBBFLOW_HEADER_ONLY 1
#endif
//! The linkage of a function that the compiled library defines: `inline`
//! when header-only, an ordinary (external) definition in separate mode.
#if defined(EBBFLOW_SEPARATE_COMPILATION)
#define EBBFLOW_DECL
#else
#define EBBFLOW_DECL inline
#endif

#define EBBFLOW_DETAIL_STR2(x) #x
#define EBBFLOW_DETAIL_STR(x) EBBFLOW_DETAIL_STR2(x)
