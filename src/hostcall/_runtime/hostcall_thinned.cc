// hostcall's thinned taps: the XLA FFI handlers of a queued call that the
// device may drop (a progress bar's tick under hostcall.jit, see
// enqueue.emit_threaded): a call is queued only where its call site (one
// device's) queued none in the last `interval_ns` nanoseconds; else the
// handler returns at once, without the queue's lock or an allocation. What
// a dropped call would have shown, a later one carries (a bar's close
// carries its count and values; invocations of one bar that run at once, in
// threads, thin each other's ticks, each closing with its own). The other calls keep their handlers
// (hostcall_queue.cc), whose cost this adds nothing to.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "hostcall_queue.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// When a site last queued a call: one slot each, found by a hash of its
// number. A slot holds the hash (its tag) and the time. Two sites sharing a slot
// replace each other, and two threads storing into one slot at once may
// leave one's tag with the other's time: either way a call is queued that
// could have been dropped, or one is dropped early, which only delays a
// redraw that a later call or the close makes (nothing is lost).
struct Slot {
  std::atomic<uint64_t> tag{0};
  std::atomic<int64_t> last{0};
};

constexpr uint64_t kSlots = 256;
Slot slots[kSlots];

uint64_t Mix(uint64_t h) {  // splitmix64's finaliser
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

// Whether the call may be dropped; if not, it is marked queued now.
bool Dropped(int64_t site, int64_t interval_ns) {
  const uint64_t tag = Mix(static_cast<uint64_t>(site)) | 1;
  Slot& slot = slots[(tag >> 1) % kSlots];
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (slot.tag.load(std::memory_order_relaxed) == tag &&
      now - slot.last.load(std::memory_order_relaxed) < interval_ns)
    return true;
  slot.last.store(now, std::memory_order_relaxed);
  slot.tag.store(tag, std::memory_order_relaxed);
  return false;
}

// The call queued, unless it may be dropped.
ffi::Error PushUnlessDropped(int64_t site, ffi::Span<const int64_t> nbytes,
                             int64_t interval_ns, ffi::RemainingArgs& args) {
  if (Dropped(site, interval_ns))
    return ffi::Error::Success();
  return hostcall::PushTap(site, nbytes, args);
}

// As hostcall_enqueue_threaded (the order value it returns carries nothing).
ffi::Error EnqueueThinned(int64_t site, ffi::Span<const int64_t> nbytes,
                          int64_t interval_ns, ffi::AnyBuffer,
                          ffi::RemainingArgs args,
                          ffi::Result<ffi::AnyBuffer> order) {
  std::memset(order->untyped_data(), 0, order->size_bytes());
  return PushUnlessDropped(site, nbytes, interval_ns, args);
}

// As hostcall_enqueue_after: the program's last call, returning nothing.
ffi::Error EnqueueThinnedAfter(int64_t site, ffi::Span<const int64_t> nbytes,
                               int64_t interval_ns, ffi::AnyBuffer,
                               ffi::RemainingArgs args) {
  return PushUnlessDropped(site, nbytes, interval_ns, args);
}

// Both handlers' attributes and operands (the order value, the operands).
auto BindThinned() {
  return ffi::Ffi::Bind()
      .Attr<int64_t>("site")
      .Attr<ffi::Span<const int64_t>>("nbytes")
      .Attr<int64_t>("interval_ns")
      .Arg<ffi::AnyBuffer>()
      .RemainingArgs();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(hostcall_enqueue_thinned, EnqueueThinned,
                              BindThinned().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(hostcall_enqueue_thinned_after,
                              EnqueueThinnedAfter, BindThinned());
