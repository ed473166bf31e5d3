// SPDX-License-Identifier: Apache-2.0
//! @file comm/detail/argument_checks.hpp
//! The argument checks every collective makes before it starts (memory
//! space, overlap, sizes, root), and the body of the `std::error_code&`
//! twins.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/memory.hpp>

#include <cstddef>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::detail {

//! Refuses `op`'s buffer `role` ("input", ...) when it is in the wrong
//! memory space (host-accessible memory, or with `device` device memory), or
//! null with elements.
inline void check_buffer(const buffer_view& v, const char* op, const char* role, bool device = false) {
  if (device)
    EBBFLOW_ENFORCE(v.space == memory_space::device,
                    op << " " << role << " must be device memory, got " << name(v.space));
  else
    EBBFLOW_ENFORCE(host_accessible(v.space), op << " " << role << " must be host memory, got " << name(v.space));
  EBBFLOW_ENFORCE(v.count == 0 || v.data != nullptr, op << " " << role << " is null with count " << v.count);
}

//! Input and output must not overlap, except with the input at `in_place`
//! (the documented in-place form): a partial overlap would be read after it
//! was overwritten.
inline void check_overlap(const buffer_view& in, const buffer_view& out, const std::byte* in_place, const char* what) {
  const auto i0 = reinterpret_cast<std::uintptr_t>(in.data), o0 = reinterpret_cast<std::uintptr_t>(out.data);
  const bool disjoint = in.bytes() == 0 || out.bytes() == 0 || i0 + in.bytes() <= o0 || o0 + out.bytes() <= i0;
  EBBFLOW_ENFORCE(disjoint || in.data == in_place, what << ": input [" << in.data << ", +" << in.bytes()
                                                        << " bytes) overlaps output [" << out.data << ", +"
                                                        << out.bytes() << " bytes) other than in place (input at "
                                                        << static_cast<const void*>(in_place) << ")");
}

// What every communicator checks before a collective of `n` ranks starts
// (`device`: its buffers are device memory). @throws std::invalid_argument.
inline void check_allreduce(const buffer_view& in, const buffer_view& out, bool device = false) {
  check_buffer(in, "allreduce", "input", device);
  check_buffer(out, "allreduce", "output", device);
  EBBFLOW_ENFORCE(in.count == out.count && in.type == out.type,
                  "allreduce: input (" << in.count << " " << name(in.type) << ") and output (" << out.count << " "
                                       << name(out.type) << ") differ");
  check_overlap(in, out, static_cast<const std::byte*>(out.data), "allreduce");
}
inline void check_broadcast(const buffer_view& buf, int root, int n, bool device = false) {
  check_buffer(buf, "broadcast", "buffer", device);
  EBBFLOW_ENFORCE(root >= 0 && root < n, "broadcast root " << root << " outside [0, " << n << ")");
}
// allgather (`gather`: out holds n x in) and reduce_scatter (in holds n x out).
inline void check_parts(const char* op, const buffer_view& in, const buffer_view& out, int n, bool gather,
                        const std::byte* in_place, bool device) {
  check_buffer(in, op, "input", device);
  check_buffer(out, op, "output", device);
  const auto un = static_cast<std::size_t>(n);
  const buffer_view &whole = gather ? out : in, &part = gather ? in : out;
  EBBFLOW_ENFORCE(in.type == out.type && whole.count == part.count * un,
                  op << ": " << (gather ? "output" : "input") << " count " << whole.count << " must be " << un << " x "
                     << (gather ? "input" : "output") << " count " << part.count << " of the same dtype");
  check_overlap(in, out, in_place, op);
}
inline void check_allgather(const buffer_view& in, const buffer_view& out, int n, int rank, bool device = false) {
  check_parts("allgather", in, out, n, true,
              static_cast<const std::byte*>(out.data) + static_cast<std::size_t>(rank) * in.bytes(), device);
}
inline void check_reduce_scatter(const buffer_view& in, const buffer_view& out, int n, bool device = false) {
  // One rank: the output may be the input (a copy to itself).
  check_parts("reduce_scatter", in, out, n, false, n == 1 ? static_cast<const std::byte*>(out.data) : nullptr, device);
}

//! The body of an `std::error_code&` twin: runs `f` (the throwing form) and
//! reports what it throws in `ec` instead: a run-time failure with its code,
//! a refused argument as `std::errc::invalid_argument`, exhausted memory as
//! `std::errc::not_enough_memory`.
template <class F>
void into_error_code(std::error_code& ec, F&& f) noexcept {
  ec.clear();
  try {
    std::forward<F>(f)();
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (const std::invalid_argument&) {
    ec = std::make_error_code(std::errc::invalid_argument);
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
  } catch (...) {
    ec = make_error_code(error::invalid_state);
  }
}

}  // namespace comm::detail
EBBFLOW_END_NAMESPACE
