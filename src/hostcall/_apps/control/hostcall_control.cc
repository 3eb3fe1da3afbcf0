// hostcall's steered loops (hostcall.control): the check a compiled loop
// makes between chunks of steps, "stop now?", answered from host state in
// about a microsecond, without Python and without making the device wait
// for the host. A library of its own (stop_states_library.py), which calls
// nothing of the asynchronous queue's; states.py is its Python interface
// (no Python twin: a platform without this FFI handler polls the same states through
// a Python callback).
//
// The host sets that state: a time limit (checked here against the clock),
// a request from a host predicate (hostcall_control_request), or Ctrl-C: a
// SIGINT handler installed here takes the first SIGINT while an
// interruptible loop runs (the loops stop at their next check and return
// normally) and hands any other to the handler it replaced (Python's, which
// raises KeyboardInterrupt).
//
// That handler is installed only while an interruptible loop runs: from the
// open of the first until the last one's computation has left the loop
// (hostcall_control_end: the loop's finish, which each device calls on the
// host once it left the loop, or the host's finding that its computation
// failed), when the handler it replaced is put back. The close of a loop's bar comes later (an asynchronous event, behind
// the loop's taps) and must not keep Ctrl-C from Python meanwhile.
//
// A loop with a host predicate waits, at check k, until the predicate has
// seen chunk k - 1 (whose tick is delivered asynchronously, while the
// device runs chunk k): it stops within one check of the predicate saying
// so, and the device waits only at a check it asked for.
//
// One invocation of a loop may run on several devices, each with its own
// handle in one group. They must stop after the same check (a loop whose
// body communicates would hang otherwise): the first check that sees a
// reason to stop fixes the stopping check to one past the highest check any
// device has made, and every device stops when it reaches it.

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int32_t kInterrupted = 1;
constexpr int32_t kTimeLimit = 2;
constexpr int32_t kFailed = 4;  // control.FAILED: a contained failure

struct Group {
  int64_t deadline_ns = 0;  // steady clock; 0: no time limit
  bool interruptible = false;
  bool predicate = false;  // a host predicate decides after each tick
  int64_t interrupts_at_open = 0;
  int32_t requested = 0;  // a host predicate's reason, once it asked
  int32_t reason = 0;     // why the loop stops, once decided
  int64_t stop_at = -1;   // the check from which every device stops
  int64_t last_check = 0;  // the highest check any device made
  int handles = 0;
  // Held by the host while a device of the invocation may still open it:
  // one that opens after its peers closed stops at their check too.
  bool held = false;
};

struct State {
  std::mutex mu;
  std::condition_variable evaluated_cv;
  std::unordered_map<int64_t, Group> groups;
  std::unordered_map<int64_t, int64_t> group_of;   // handle -> group
  std::unordered_map<int64_t, int64_t> evaluated;  // handle -> ticks seen
};

// How long a check waits for the predicate before going on undecided.
constexpr auto kPredicateWait = std::chrono::seconds(60);

State& state() {
  static State* s = new State();  // never destroyed: XLA threads may outlive
  return *s;
}

std::atomic<int64_t> interrupts{0};           // SIGINTs taken for loops
std::atomic<int64_t> interruptible_open{0};   // their handles running now
std::atomic<int64_t> predicate_open{0};       // handles waiting on predicates
std::atomic<int> first_taken{0};              // 1 once one SIGINT was taken
// What SIGINT did before hostcall's handler; read by OnSigint, written only
// while it is not installed (sigint_mu orders installing and restoring).
struct sigaction previous_action;
std::mutex sigint_mu;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void OnSigint(int signo, siginfo_t* info, void* context) {
  // Only atomics here: this runs in whatever thread the signal interrupts.
  if (interruptible_open.load() > 0 && first_taken.exchange(1) == 0) {
    interrupts.fetch_add(1);
    return;
  }
  if (previous_action.sa_flags & SA_SIGINFO) {
    previous_action.sa_sigaction(signo, info, context);
  } else if (previous_action.sa_handler == SIG_DFL) {
    signal(signo, SIG_DFL);
    raise(signo);
  } else if (previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(signo);
  }
}

bool OursInstalled() {
  struct sigaction current;
  return sigaction(SIGINT, nullptr, &current) == 0 &&
         (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == OnSigint;
}

// Called with sigint_mu held, when the first interruptible handle opens.
void InstallSigint() {
  if (OursInstalled()) return;
  struct sigaction current;
  if (sigaction(SIGINT, nullptr, &current) != 0) return;
  previous_action = current;
  struct sigaction ours = {};
  ours.sa_sigaction = OnSigint;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  sigaction(SIGINT, &ours, nullptr);
}

// Called with sigint_mu held, when the last interruptible handle stops
// running. A handler that Python installed over ours meanwhile
// (signal.signal) stays.
void RestoreSigint() {
  if (OursInstalled()) sigaction(SIGINT, &previous_action, nullptr);
}

// Whether `handle` still counts as a running interruptible loop: cleared by
// its end (or close), whichever comes first. Called with State::mu held.
std::unordered_map<int64_t, bool>& running() {
  static auto* r = new std::unordered_map<int64_t, bool>();
  return *r;
}

// Called with State::mu held: `handle` no longer runs its loop.
void StopRunning(int64_t handle) {
  auto found = running().find(handle);
  if (found == running().end()) return;
  const bool interruptible = found->second;
  running().erase(found);
  if (!interruptible) return;
  std::lock_guard<std::mutex> lock(sigint_mu);
  if (interruptible_open.fetch_sub(1) == 1) RestoreSigint();
}

int32_t Poll(int64_t handle, int64_t check) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  auto found = s.group_of.find(handle);
  if (found == s.group_of.end()) return 0;
  const int64_t group = found->second;
  if (s.groups[group].predicate && s.groups[group].stop_at < 0) {
    // (The tick this check waits for is not left gathering in the
    // asynchronous queue: the loop's open adds a waiter on it,
    // host.py.)
    s.evaluated_cv.wait_for(lock, kPredicateWait, [&] {
      auto g = s.groups.find(group);
      auto seen = s.evaluated.find(handle);
      return g == s.groups.end() || g->second.requested ||
             seen == s.evaluated.end() || seen->second >= check - 1;
    });
    if (s.groups.find(group) == s.groups.end()) return 0;
  }
  Group& g = s.groups[group];
  if (g.stop_at < 0) {
    int32_t reason = g.requested;
    if (!reason && g.interruptible && interrupts.load() > g.interrupts_at_open)
      reason = kInterrupted;
    if (!reason && g.deadline_ns && NowNs() >= g.deadline_ns)
      reason = kTimeLimit;
    if (reason) {
      g.reason = reason;
      g.stop_at = g.last_check + 1;
    }
  }
  if (check > g.last_check) g.last_check = check;
  return (g.stop_at >= 0 && check >= g.stop_at) ? g.reason : 0;
}

// `after` is the chunk's results (a number read from them), unread: the
// operand keeps XLA from asking before the chunk has run.
ffi::Error Check(ffi::Buffer<ffi::S32> handle, ffi::Buffer<ffi::S32> check,
                 ffi::AnyBuffer after, ffi::ResultBuffer<ffi::S32> reason) {
  (void)after;
  reason->typed_data()[0] =
      Poll(handle.typed_data()[0], check.typed_data()[0]);
  return ffi::Error::Success();
}

// A steered loop's end on a device whose host side hostcall.jit does not
// ask in the common case: the handle takes no more Ctrl-C (as
// hostcall_control_end), and the answer says whether the host's finish
// must still run: 1 where it has a failure to raise (the loop's group
// contained one, or the loop stopped for one) or cannot tell (the handle
// is not open), else 0.
int32_t FinishHere(int64_t handle, int32_t reason) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  StopRunning(handle);
  if (reason == kFailed) return 1;
  auto found = s.group_of.find(handle);
  if (found == s.group_of.end()) return 1;
  auto group = s.groups.find(found->second);
  if (group == s.groups.end()) return 1;
  return group->second.requested == kFailed ? 1 : 0;
}

ffi::Error Finish(ffi::Buffer<ffi::S32> handle, ffi::Buffer<ffi::S32> reason,
                  ffi::ResultBuffer<ffi::S32> ask_host) {
  ask_host->typed_data()[0] =
      FinishHere(handle.typed_data()[0], reason.typed_data()[0]);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(hostcall_control_finish, Finish,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(hostcall_control_check, Check,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

extern "C" {

// Opens a device's handle on an invocation group. The group's first handle
// fixes its time limit (microseconds from now; < 0: none; any int64 is
// safe) and whether Ctrl-C stops it.
void hostcall_control_open(int64_t handle, int64_t group,
                           int64_t time_limit_us, int64_t interruptible,
                           int64_t predicate) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto created = s.groups.try_emplace(group);
  Group& g = created.first->second;
  if (created.second) {
    // A limit past what the clock can count to (int64 nanoseconds) is
    // never reached: saturated, not wrapped round to the past.
    const int64_t now = NowNs();
    g.deadline_ns = time_limit_us < 0 ? 0
                    : time_limit_us >= (INT64_MAX - now) / 1000
                        ? INT64_MAX
                        : now + time_limit_us * 1000;
    g.interruptible = interruptible != 0;
    g.predicate = predicate != 0;
    g.interrupts_at_open = interrupts.load();
  }
  s.group_of[handle] = group;
  s.evaluated[handle] = 0;
  ++g.handles;
  if (g.predicate) predicate_open.fetch_add(1);
  running()[handle] = g.interruptible;
  if (g.interruptible) {
    std::lock_guard<std::mutex> sigint_lock(sigint_mu);
    if (interruptible_open.fetch_add(1) == 0) {
      first_taken.store(0);  // a new run of loops: the next Ctrl-C is theirs
      InstallSigint();
    }
  }
}

// `handle`'s loop has ended (its computation went past it, or failed): it
// takes no more Ctrl-C. What else it holds stays until its close.
void hostcall_control_end(int64_t handle) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  StopRunning(handle);
}

// Whether `handle`'s loop still runs (1): opened, and not ended or closed.
int64_t hostcall_control_running(int64_t handle) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return running().count(handle) ? 1 : 0;
}

// A host function failed on the device running `handle`: where its loop
// still runs, `group` stops for the failure (1); else (0) the loop has ended
// (its device's own finish, under hostcall.jit, may have just run) and the
// failure is not the loop's to hold. One lock with that finish: it either
// sees the request, or this sees the loop ended.
int64_t hostcall_control_contain(int64_t handle, int64_t group) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!running().count(handle)) return 0;
    auto found = s.groups.find(group);
    if (found != s.groups.end()) found->second.requested = kFailed;
  }
  s.evaluated_cv.notify_all();
  return 1;
}

// A host predicate asks the group to stop, for `reason`.
void hostcall_control_request(int64_t group, int64_t reason) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto found = s.groups.find(group);
    // A failure outranks a reason asked for before it: every process must
    // learn of it (the checks' pmax carries the highest reason).
    if (found != s.groups.end() &&
        (!found->second.requested || reason == kFailed)) {
      found->second.requested = static_cast<int32_t>(reason);
    }
  }
  s.evaluated_cv.notify_all();
}

// The predicate has seen one more tick of `handle`.
void hostcall_control_evaluated(int64_t handle) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto found = s.evaluated.find(handle);
    if (found != s.evaluated.end()) ++found->second;
  }
  s.evaluated_cv.notify_all();
}

void hostcall_control_close(int64_t handle) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto found = s.group_of.find(handle);
  if (found == s.group_of.end()) return;
  auto group = s.groups.find(found->second);
  s.group_of.erase(found);
  s.evaluated.erase(handle);
  s.evaluated_cv.notify_all();
  StopRunning(handle);
  if (group == s.groups.end()) return;
  if (group->second.predicate) predicate_open.fetch_sub(1);
  if (--group->second.handles == 0 && !group->second.held)
    s.groups.erase(group);
}

// Keeps `group` (opened by a handle) after its last handle closes, until
// hostcall_control_release: the invocation may have devices still to open.
void hostcall_control_hold(int64_t group) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto found = s.groups.find(group);
  if (found != s.groups.end()) found->second.held = true;
}

// Every device of `group`'s invocation has closed: it is forgotten with
// its last handle (now, if none is open).
void hostcall_control_release(int64_t group) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto found = s.groups.find(group);
  if (found == s.groups.end()) return;
  found->second.held = false;
  if (found->second.handles == 0) s.groups.erase(found);
}

// How many open handles have checks that wait for a host predicate.
int64_t hostcall_control_predicates_open() { return predicate_open.load(); }

// The check, for the Python-callback path (several devices under jit).
int64_t hostcall_control_poll(int64_t handle, int64_t check) {
  return Poll(handle, check);
}

// Whether hostcall's SIGINT handler is installed now (1) or not (0).
int64_t hostcall_control_sigint_installed() {
  std::lock_guard<std::mutex> lock(sigint_mu);
  return OursInstalled() ? 1 : 0;
}

// SIGINTs taken for interruptible loops so far.
int64_t hostcall_control_interrupts() { return interrupts.load(); }

}  // extern "C"
