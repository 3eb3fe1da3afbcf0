// hostcall's native tap path: an XLA FFI handler that copies a tap's operands
// into a bounded host queue and returns at once, and C functions (called from
// Python through ctypes, which releases the GIL) that take items out.
//
// The device never waits for Python: a full queue blocks the handler (back
// pressure) until the Python consumer has delivered enough; nothing is
// dropped. What the bytes mean (dtypes, shapes) is known on the host from the
// call site, fixed when the program was lowered: an item is a site number and
// the operands' bytes, one after the other, as many of each as the lowering
// said (the "nbytes" attribute; sub-byte types arrive packed). Items queued
// from Python (the Python-callback path) carry no bytes here, only a key to
// arrays the Python side holds and the room they take.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

#include "hostcall_queue.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Item {
  int64_t site = 0;
  int64_t key = 0;        // 0: the bytes are here; else Python holds arrays
  int64_t accounted = 0;  // the room the item takes in the queue
  int64_t size = 0;       // the operands' bytes, at `bytes`:
  char* bytes = nullptr;  // right after the item, or in a large one's block
  std::vector<char> block;
};

constexpr int64_t kItemOverhead = 64;

struct Queue {
  std::mutex mu;
  std::condition_variable not_empty, not_full;
  std::deque<Item*> items;
  int64_t bytes = 0;
  int64_t capacity = int64_t{64} << 20;
  int64_t pushed = 0;
  int64_t trips = 0;  // pops that took items
  int64_t blocked = 0;  // times a producer waited for room
  bool consumer_waiting = false;
  // The consumer lets items gather before it takes them (see hostcall_pop):
  // a producer wakes it early only when it must not wait (MustDeliverNow).
  bool consumer_gathering = false;
  int64_t gather_items = 0;  // what one pop takes at most
  int64_t waiters = 0;         // threads waiting for delivery (barriers)
  // The items queued now are to be taken at once (hostcall_flush_soon),
  // those queued after them gather as usual.
  bool flush = false;
  int producers_waiting = 0;
  // The consumer thread: a tap made while it delivers (a host function that
  // runs a JAX computation with asynchronous taps) must not wait for room
  // only that thread can free. A tap of a computation that such a host
  // function started runs on another thread: the consumer's watchdog sees
  // the host function waiting inside JAX and lets producers through
  // (`bypass`) until it returns.
  std::thread::id consumer;
  bool bypass = false;
  // Data blocks of delivered items, kept for reuse: a fresh large block
  // costs a page fault per 4 KiB, far more than copying into a warm one.
  std::vector<std::vector<char>> spare;
  int64_t spare_bytes = 0;
};

constexpr int64_t kMaxSpareBytes = int64_t{64} << 20;
constexpr int64_t kMinPooled = 16 << 10;  // small blocks come from malloc

Queue& queue() {
  static Queue* q = new Queue();  // never destroyed: XLA threads may outlive
  return *q;
}

std::vector<char> TakeBlock(Queue& q, int64_t size) {
  if (size >= kMinPooled) {
    std::lock_guard<std::mutex> lock(q.mu);
    for (size_t i = q.spare.size(); i-- > 0;) {
      if (static_cast<int64_t>(q.spare[i].capacity()) >= size) {
        std::vector<char> block = std::move(q.spare[i]);
        q.spare.erase(q.spare.begin() + i);
        q.spare_bytes -= block.capacity();
        block.resize(size);
        return block;
      }
    }
  }
  return std::vector<char>(size);
}

// Called with q.mu held.
void KeepBlock(Queue& q, std::vector<char>&& block) {
  const int64_t size = block.capacity();
  if (size >= kMinPooled && q.spare_bytes + size <= kMaxSpareBytes) {
    q.spare_bytes += size;
    q.spare.push_back(std::move(block));
  }
}

// A new item for `size` bytes: a small one's bytes follow it in one
// allocation (one malloc and one free a tap: hostcall.jit queues a few bytes
// a call), a large one's come from the spare blocks.
Item* NewItem(int64_t size) {
  const bool small = size < kMinPooled;
  void* memory = ::operator new(sizeof(Item) + (small ? size : 0));
  Item* item = new (memory) Item();
  item->size = size;
  if (small) {
    item->bytes = reinterpret_cast<char*>(item + 1);
  } else {
    item->block = TakeBlock(queue(), size);
    item->bytes = item->block.data();
  }
  return item;
}

// Frees an item, keeping a large block for reuse. Only that takes the lock:
// the consumer frees hostcall.jit's small items by the hundred a trip.
void Release(Queue& q, Item* item) {
  if (static_cast<int64_t>(item->block.capacity()) >= kMinPooled) {
    std::lock_guard<std::mutex> lock(q.mu);
    KeepBlock(q, std::move(item->block));
  }
  item->~Item();
  ::operator delete(item);
}

// Called with q.mu held: whether a gathering consumer must take the items
// now: someone waits for their delivery (hostcall_add_waiters: a barrier, a
// steered loop whose checks wait for its predicate; or a producer that
// needs room), or they fill a batch or a quarter of the queue.
bool MustDeliverNow(const Queue& q) {
  return q.waiters > 0 || q.flush || q.producers_waiting > 0 ||
         static_cast<int64_t>(q.items.size()) >= q.gather_items ||
         q.bytes >= q.capacity / 4;
}

// Puts an item in the queue, waiting for room if it is full.
void Insert(Item* item) {
  Queue& q = queue();
  {
    std::unique_lock<std::mutex> lock(q.mu);
    if (q.bytes > 0 && q.bytes + item->accounted > q.capacity &&
        !q.bypass && std::this_thread::get_id() != q.consumer) {
      ++q.blocked;
      ++q.producers_waiting;
      if (q.consumer_gathering) q.not_empty.notify_one();
      // A lone item larger than the capacity still goes through.
      q.not_full.wait(lock, [&] {
        return q.bypass || q.bytes == 0 ||
               q.bytes + item->accounted <= q.capacity;
      });
      --q.producers_waiting;
    }
    q.items.push_back(item);
    q.bytes += item->accounted;
    ++q.pushed;
    // Wake the consumer only when it sleeps, or gathers and must not: a
    // busy one finds the item anyway, and every wake-up costs the device
    // thread (a system call, and on a small machine the consumer's run
    // slows the device's core: measured, docs/performance.md).
    if (!q.consumer_waiting && !(q.consumer_gathering && MustDeliverNow(q)))
      return;
  }
  q.not_empty.notify_one();
}

ffi::Error Push(int64_t site, ffi::Span<const int64_t> nbytes,
                ffi::RemainingArgs args) {
  if (nbytes.size() != args.size()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "hostcall: tap operands and their sizes disagree");
  }
  int64_t total = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value() ||
        nbytes[i] > static_cast<int64_t>(buffer->size_bytes())) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        "hostcall: a tap operand is not the buffer its call "
                        "site was lowered for");
    }
    total += nbytes[i];
  }
  Item* item = NewItem(total);
  item->site = site;
  item->accounted = total + kItemOverhead;
  int64_t offset = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (nbytes[i]) {
      std::memcpy(item->bytes + offset,
                  args.get<ffi::AnyBuffer>(i)->untyped_data(), nbytes[i]);
    }
    offset += nbytes[i];
  }
  Insert(item);
  return ffi::Error::Success();
}

ffi::Error Enqueue(int64_t site, ffi::Span<const int64_t> nbytes,
                   ffi::RemainingArgs args) {
  return Push(site, nbytes, args);
}

ffi::Error EnqueueOrdered(int64_t site, ffi::Span<const int64_t> nbytes,
                          ffi::Token, ffi::RemainingArgs args,
                          ffi::Result<ffi::Token>) {
  return Push(site, nbytes, args);
}

// An effect-free program orders its taps by a value each returns and the
// next takes (hostcall.jit); the value itself carries nothing.
ffi::Error EnqueueThreaded(int64_t site, ffi::Span<const int64_t> nbytes,
                           ffi::AnyBuffer, ffi::RemainingArgs args,
                           ffi::Result<ffi::AnyBuffer> order) {
  std::memset(order->untyped_data(), 0, order->size_bytes());
  return Push(site, nbytes, args);
}

// The last call of such a program: after the call that returned the value
// it takes, and nothing waits for it (no result: no buffer to allocate).
ffi::Error EnqueueAfter(int64_t site, ffi::Span<const int64_t> nbytes,
                        ffi::AnyBuffer, ffi::RemainingArgs args) {
  return Push(site, nbytes, args);
}

// A queued call whose answer the device makes (a progress bar's open
// under hostcall.jit): a handle of its own for each invocation, which the
// call queues beside its operands and the host adopts, so that invocations
// running at once (threads calling one program) are never mixed; and when
// it was made (a barrier ends what the device opened before it, as it ends
// a live open's); and the thread that made it, which is the thread running
// the computation (a failure of that computation, raised by a host function
// on that thread, ends only the invocations it opened, as a live open's
// thread tells them apart under jax.jit). Five int32: the handle, the
// nanoseconds of the monotonic clock (Python's time.monotonic_ns()'s), then
// the thread (pthread_self(), Python's threading.get_ident(); 0 where there
// is none), each low word first. The handles are above the host's own
// (enqueue.DEVICE_HANDLES) and wrap after about a billion.
constexpr uint32_t kDeviceHandles = 0x40000000;

uint64_t ThisThread() {
#if defined(__unix__) || defined(__APPLE__)
  // What CPython's threading.get_ident() returns on these systems.
  // (pthread_t is an integer on Linux, a pointer on macOS.)
  return (uint64_t)(uintptr_t)pthread_self();
#else
  return 0;
#endif
}

std::atomic<uint32_t> handles_made{0};

ffi::Error NewHandle(ffi::Result<ffi::BufferR1<ffi::S32>> made) {
  if (made->element_count() != 5) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "hostcall: a handle's result is five int32");
  }
  const uint32_t n = handles_made.fetch_add(1, std::memory_order_relaxed);
  const uint64_t ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
  int32_t* out = made->typed_data();
  out[0] = static_cast<int32_t>(kDeviceHandles +
                                n % (0x7FFFFFFFu - kDeviceHandles));
  out[1] = static_cast<int32_t>(static_cast<uint32_t>(ns));
  out[2] = static_cast<int32_t>(static_cast<uint32_t>(ns >> 32));
  const uint64_t thread = ThisThread();
  out[3] = static_cast<int32_t>(static_cast<uint32_t>(thread));
  out[4] = static_cast<int32_t>(static_cast<uint32_t>(thread >> 32));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    hostcall_new_handle, NewHandle,
    ffi::Ffi::Bind().Ret<ffi::BufferR1<ffi::S32>>());

ffi::Error hostcall::PushTap(int64_t site, ffi::Span<const int64_t> nbytes,
                             ffi::RemainingArgs args) {
  return Push(site, nbytes, args);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    hostcall_enqueue_after, EnqueueAfter,
    ffi::Ffi::Bind()
        .Attr<int64_t>("site")
        .Attr<ffi::Span<const int64_t>>("nbytes")
        .Arg<ffi::AnyBuffer>()
        .RemainingArgs());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    hostcall_enqueue_threaded, EnqueueThreaded,
    ffi::Ffi::Bind()
        .Attr<int64_t>("site")
        .Attr<ffi::Span<const int64_t>>("nbytes")
        .Arg<ffi::AnyBuffer>()
        .RemainingArgs()
        .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    hostcall_enqueue, Enqueue,
    ffi::Ffi::Bind()
        .Attr<int64_t>("site")
        .Attr<ffi::Span<const int64_t>>("nbytes")
        .RemainingArgs());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    hostcall_enqueue_ordered, EnqueueOrdered,
    ffi::Ffi::Bind()
        .Attr<int64_t>("site")
        .Attr<ffi::Span<const int64_t>>("nbytes")
        .Arg<ffi::Token>()
        .RemainingArgs()
        .Ret<ffi::Token>());

extern "C" {

// Makes the calling thread the consumer (see Queue::consumer).
void hostcall_become_consumer() {
  Queue& q = queue();
  std::lock_guard<std::mutex> lock(q.mu);
  q.consumer = std::this_thread::get_id();
}

// Waits up to timeout_ms for items, then up to gather_us more for others
// to join them (unless they must be delivered now, see MustDeliverNow);
// moves up to max_items of them into out (each given back with
// hostcall_uncount_many, then freed with hostcall_free) and returns how many.
int64_t hostcall_pop(int64_t timeout_ms, int64_t max_items, int64_t gather_us,
                     void** out) {
  Queue& q = queue();
  std::unique_lock<std::mutex> lock(q.mu);
  if (q.items.empty()) {
    q.consumer_waiting = true;
    q.not_empty.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                         [&] { return !q.items.empty(); });
    q.consumer_waiting = false;
  }
  q.gather_items = max_items;
  if (!q.items.empty() && gather_us > 0 && !MustDeliverNow(q)) {
    q.consumer_gathering = true;
    q.not_empty.wait_for(lock, std::chrono::microseconds(gather_us),
                         [&] { return MustDeliverNow(q); });
    q.consumer_gathering = false;
  }
  int64_t n = 0;
  while (n < max_items && !q.items.empty()) {
    out[n++] = q.items.front();
    q.items.pop_front();
  }
  if (n) ++q.trips;
  if (q.items.empty()) q.flush = false;  // what it asked for is taken
  return n;
}

// Describes an item: out[0] site, out[1] key, out[2] data address, out[3]
// data size.
void hostcall_describe(void* handle, int64_t* out) {
  Item* item = static_cast<Item*>(handle);
  out[0] = item->site;
  out[1] = item->key;
  out[2] = reinterpret_cast<int64_t>(item->bytes);
  out[3] = item->size;
}

// Describes n items at once: 4 int64 each in out, as hostcall_describe.
void hostcall_describe_many(void** handles, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) hostcall_describe(handles[i], out + 4 * i);
}

// Copies the data of every item of less than `below` bytes, one after the
// other, into dest, and frees them and the items without data (their room
// given back already); items of `below` bytes or more are left to the
// caller (handed over as views, freed with hostcall_free).
void hostcall_copy_free_many(void** handles, int64_t n, int64_t below,
                             char* dest) {
  Queue& q = queue();
  for (int64_t i = 0; i < n; ++i) {
    Item* item = static_cast<Item*>(handles[i]);
    const int64_t size = item->size;
    if (item->key == 0 && size >= below) continue;
    if (item->key == 0 && size) {
      std::memcpy(dest, item->bytes, size);
      dest += size;
    }
    Release(q, item);
  }
}

// Queues an item whose arrays the Python side holds under `key` (the
// Python-callback path), so that it keeps its place among the taps the FFI
// handler queues, and takes `nbytes` of room.
void hostcall_push_host(int64_t site, int64_t key, int64_t nbytes) {
  Item* item = NewItem(0);
  item->site = site;
  item->key = key;
  item->accounted = nbytes + kItemOverhead;
  Insert(item);
}

// Gives back the room delivered items held (one lock for all); their data
// stays until hostcall_free (a host function's arrays may be views on it).
void hostcall_uncount_many(void** handles, int64_t n) {
  Queue& q = queue();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    for (int64_t i = 0; i < n; ++i) {
      Item* item = static_cast<Item*>(handles[i]);
      q.bytes -= item->accounted;
      item->accounted = 0;
    }
    wake = q.producers_waiting > 0;
  }
  if (wake) q.not_full.notify_all();
}

// Frees an item whose room was given back, keeping its block for reuse.
void hostcall_free(void* handle) { Release(queue(), static_cast<Item*>(handle)); }

// A thread starts (+1) or stops (-1) waiting for the queue's items to be
// delivered (a barrier; a steered loop with a host predicate holds one
// while it is open, its checks waiting for the predicate to see each tick):
// while any waits, the consumer takes items without gathering.
void hostcall_add_waiters(int64_t delta) {
  Queue& q = queue();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.waiters += delta;
  }
  if (delta > 0) q.not_empty.notify_one();
}

// The items queued now are taken without waiting for more to gather (a
// barrier about to wait for them: the consumer wakes while the barrier
// waits for running computations), and nothing after them is rushed.
void hostcall_flush_soon() {
  Queue& q = queue();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.items.empty()) return;
    q.flush = true;
    if (!q.consumer_gathering) return;  // it takes them when it looks
  }
  q.not_empty.notify_one();
}

// Lets producers through a full queue (1) or not (0); see Queue::bypass.
void hostcall_set_bypass(int64_t on) {
  Queue& q = queue();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.bypass = on != 0;
  }
  if (on) q.not_full.notify_all();
}

void hostcall_set_capacity(int64_t bytes) {
  Queue& q = queue();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.capacity = bytes;
  }
  q.not_full.notify_all();
}

// stats: pushed, queued items, queued bytes, capacity, producer waits,
// producers waiting now, the consumer's trips.
void hostcall_stats(int64_t* out) {
  Queue& q = queue();
  std::lock_guard<std::mutex> lock(q.mu);
  out[0] = q.pushed;
  out[1] = static_cast<int64_t>(q.items.size());
  out[2] = q.bytes;
  out[3] = q.capacity;
  out[4] = q.blocked;
  out[5] = q.producers_waiting;
  out[6] = q.trips;
}

}  // extern "C"
