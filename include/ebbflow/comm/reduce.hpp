// SPDX-License-Identifier: Apache-2.0
//! @file reduce.hpp
//! Element-wise reduction kernels on host memory, used by every collective:
//! `dst[i] = op(a[i], b[i])` for each dtype and `reduce_op`, and the final
//! division of `avg`. f16/bf16 are widened to f32, combined and rounded back
//! (round to nearest even) at every step.
//!
//! The kernels are written as explicit 16-element blocks over GCC/Clang vector
//! extensions, so they vectorise at -O2 (GCC 12 does not vectorise the plain
//! `a[i] += b[i]` loop at -O2). `dst` may equal `a` exactly (in-place); no
//! other overlap is allowed. All pointers are host memory. Never blocks,
//! never throws; thread-safe (no shared state).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/dtype.hpp>

#include <cstddef>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! `dst[i] = op(a[i], b[i])` for `count` elements of `type` (`avg` combines
//! like `sum`; divide once at the end with `finish_avg`). `dst` may be `a`.
inline void reduce(dtype type, reduce_op op, void* dst, const void* a, const void* b, std::size_t count) noexcept;

//! `dst[i] /= divisor` for `count` elements (integers: truncating division);
//! the last step of `reduce_op::avg`.
inline void finish_avg(dtype type, void* dst, std::size_t count, int divisor) noexcept;

}  // namespace comm
EBBFLOW_END_NAMESPACE

#include <ebbflow/comm/impl/reduce.hpp>
