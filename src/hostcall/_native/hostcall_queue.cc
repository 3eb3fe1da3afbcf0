// hostcall's native tap path: an XLA FFI handler that copies a tap's operands
// into a bounded host queue and returns at once, and C functions (called from
// Python through ctypes, which releases the GIL) that take items out.
//
// The device never waits for Python: a full queue blocks the handler (back
// pressure) until the Python consumer has delivered enough; nothing is
// dropped.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kMaxRank = 16;

struct BufferMeta {
  int64_t dtype;
  int64_t rank;
  int64_t dims[kMaxRank];
  int64_t offset;
  int64_t nbytes;
};

struct Item {
  int64_t site;
  std::vector<BufferMeta> metas;
  std::vector<char> data;
};

struct Queue {
  std::mutex mu;
  std::condition_variable not_empty, not_full;
  std::deque<Item*> items;
  int64_t bytes = 0;
  int64_t capacity = int64_t{64} << 20;
  int64_t pushed = 0;
  int64_t blocked = 0;     // times a producer waited for room
  bool consumer_waiting = false;
  int producers_waiting = 0;
  // Data blocks of delivered items, kept for reuse: a fresh large block
  // costs a page fault per 4 KiB, far more than copying into a warm one.
  std::vector<std::vector<char>> spare;
  int64_t spare_bytes = 0;
};

constexpr int64_t kMaxSpareBytes = int64_t{64} << 20;
constexpr int64_t kMinPooled = 16 << 10;  // small blocks come from malloc

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

Queue& queue() {
  static Queue* q = new Queue();  // never destroyed: XLA threads may outlive
  return *q;
}

void Insert(Item* item);

ffi::Error Push(int64_t site, ffi::RemainingArgs args) {
  Item* item = new Item();
  item->site = site;
  int64_t total = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value()) {
      delete item;
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        "hostcall: tap operand is not a buffer");
    }
    BufferMeta meta{};
    meta.dtype = static_cast<int64_t>(buffer->element_type());
    auto dims = buffer->dimensions();
    if (dims.size() > kMaxRank) {
      delete item;
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        "hostcall: tap operand has rank above 16");
    }
    meta.rank = dims.size();
    for (size_t d = 0; d < dims.size(); ++d) meta.dims[d] = dims[d];
    meta.offset = total;
    meta.nbytes = buffer->size_bytes();
    total += meta.nbytes;
    item->metas.push_back(meta);
  }
  item->data = TakeBlock(queue(), total);
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    const BufferMeta& meta = item->metas[i];
    if (meta.nbytes) {
      std::memcpy(item->data.data() + meta.offset, buffer->untyped_data(),
                  meta.nbytes);
    }
  }
  Insert(item);
  return ffi::Error::Success();
}

// Puts an item in the queue, waiting for room if it is full.
void Insert(Item* item) {
  const int64_t size = static_cast<int64_t>(item->data.size()) + 64;
  Queue& q = queue();
  {
    std::unique_lock<std::mutex> lock(q.mu);
    if (q.bytes > 0 && q.bytes + size > q.capacity) {
      ++q.blocked;
      ++q.producers_waiting;
      // A lone item larger than the capacity still goes through.
      q.not_full.wait(lock, [&] {
        return q.bytes == 0 || q.bytes + size <= q.capacity;
      });
      --q.producers_waiting;
    }
    q.items.push_back(item);
    q.bytes += size;
    ++q.pushed;
    // Wake the consumer only when it sleeps: a busy one finds the item
    // anyway, and the device thread saves a system call per tap.
    if (!q.consumer_waiting) return;
  }
  q.not_empty.notify_one();
}

ffi::Error Enqueue(int64_t site, ffi::RemainingArgs args) {
  return Push(site, args);
}

ffi::Error EnqueueOrdered(int64_t site, ffi::Token, ffi::RemainingArgs args,
                          ffi::Result<ffi::Token>) {
  return Push(site, args);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    hostcall_enqueue, Enqueue,
    ffi::Ffi::Bind().Attr<int64_t>("site").RemainingArgs());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    hostcall_enqueue_ordered, EnqueueOrdered,
    ffi::Ffi::Bind()
        .Attr<int64_t>("site")
        .Arg<ffi::Token>()
        .RemainingArgs()
        .Ret<ffi::Token>());

extern "C" {

// Waits up to timeout_ms for items; moves up to max_items of them into out
// (each to be freed with hostcall_release) and returns how many.
int64_t hostcall_pop(int64_t timeout_ms, int64_t max_items, void** out) {
  Queue& q = queue();
  std::unique_lock<std::mutex> lock(q.mu);
  if (q.items.empty()) {
    q.consumer_waiting = true;
    q.not_empty.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                         [&] { return !q.items.empty(); });
    q.consumer_waiting = false;
  }
  int64_t n = 0;
  while (n < max_items && !q.items.empty()) {
    out[n++] = q.items.front();
    q.items.pop_front();
  }
  return n;
}

// Frees an item's memory and the room it held in the queue.
void hostcall_release(void* handle) {
  Item* item = static_cast<Item*>(handle);
  Queue& q = queue();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.bytes -= static_cast<int64_t>(item->data.size()) + 64;
    wake = q.producers_waiting > 0;
  }
  if (wake) q.not_full.notify_all();
  delete item;
}

// Describes an item in one call: out[0] site, out[1] buffer count, out[2]
// data address, out[3] data size, then for each of the first max_buffers
// buffers its 20 metadata words (dtype, rank, dims[16], offset, nbytes).
void hostcall_describe(void* handle, int64_t max_buffers, int64_t* out) {
  Item* item = static_cast<Item*>(handle);
  out[0] = item->site;
  out[1] = item->metas.size();
  out[2] = reinterpret_cast<int64_t>(item->data.data());
  out[3] = item->data.size();
  const size_t n = std::min<size_t>(item->metas.size(), max_buffers);
  std::memcpy(out + 4, item->metas.data(), n * sizeof(BufferMeta));
}

// Queues an item built on the host (the Python-callback path), so that it
// keeps its place among the taps the FFI handler queues.
void hostcall_push_host(int64_t site, int64_t n, const int64_t* metas,
                        const char* data, int64_t size) {
  Item* item = new Item();
  item->site = site;
  item->metas.resize(n);
  std::memcpy(item->metas.data(), metas, n * sizeof(BufferMeta));
  item->data.assign(data, data + size);
  Insert(item);
}

// Frees many items at once (one lock for all).
void hostcall_release_many(void** handles, int64_t n) {
  Queue& q = queue();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    for (int64_t i = 0; i < n; ++i) {
      Item* item = static_cast<Item*>(handles[i]);
      q.bytes -= static_cast<int64_t>(item->data.size()) + 64;
      KeepBlock(q, std::move(item->data));
    }
    wake = q.producers_waiting > 0;
  }
  if (wake) q.not_full.notify_all();
  for (int64_t i = 0; i < n; ++i) delete static_cast<Item*>(handles[i]);
}

void hostcall_set_capacity(int64_t bytes) {
  Queue& q = queue();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.capacity = bytes;
  }
  q.not_full.notify_all();
}

// stats: pushed, queued items, queued bytes, capacity, producer waits.
void hostcall_stats(int64_t* out) {
  Queue& q = queue();
  std::lock_guard<std::mutex> lock(q.mu);
  out[0] = q.pushed;
  out[1] = q.items.size();
  out[2] = q.bytes;
  out[3] = q.capacity;
  out[4] = q.blocked;
}

}  // extern "C"
