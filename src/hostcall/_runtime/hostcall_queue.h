// What hostcall_queue.cc shares with the other handlers that queue a tap
// (hostcall_thinned.cc): the one way into the queue.

#ifndef HOSTCALL_RUNTIME_HOSTCALL_QUEUE_H_
#define HOSTCALL_RUNTIME_HOSTCALL_QUEUE_H_

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace hostcall {

// Copies `nbytes` of each operand in `args` into one queue item for `site`
// (waiting for room if the queue is full), as every hostcall_enqueue
// handler does.
xla::ffi::Error PushTap(int64_t site, xla::ffi::Span<const int64_t> nbytes,
                        xla::ffi::RemainingArgs args);

}  // namespace hostcall

#endif  // HOSTCALL_RUNTIME_HOSTCALL_QUEUE_H_
