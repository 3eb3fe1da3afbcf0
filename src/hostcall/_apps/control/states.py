"""Each invocation's stop state, what a steered loop's check reads: the
native stop states of ``hostcall_control.cc``, one set a process. The
compiled check reads them without Python where the emission table routes
the check to its FFI handler; elsewhere (``HOSTCALL_NATIVE=0``, a platform
without the handler) a Python callback polls the same states through
ctypes. Ctrl-C is taken by the library's own SIGINT handler either way."""

from __future__ import annotations

from hostcall._apps.control import stop_states_library
from hostcall._apps.control.spec import MAX_LIMIT_US, Stop

#: How long a check waits for the predicate before going on undecided
#: (``hostcall_control.cc``'s wait, in seconds).
PREDICATE_WAIT = 60.0


class StopStates:
  """The stop states of every open handle (one device's run of one
  invocation), grouped by invocation: what decides, at each check, whether
  a loop stops (a predicate's request, Ctrl-C, the time limit), so that
  every device of an invocation stops after the same check.

  Arguments:
    lib: the loaded stop-check library (``stop_states_library.load()``).

  Example:
    >>> from hostcall._apps.control import stop_states_library
    >>> from hostcall._apps.control.states import StopStates
    >>> from hostcall._apps.control.spec import Stop, STOP_WHEN
    >>> states = StopStates(stop_states_library.load())
    >>> states.open(90001, group=90001, stop=Stop.of(False, 3600.0, None))
    >>> states.poll(90001, 1)   # no reason to stop: go on
    0
    >>> states.request(90001, STOP_WHEN)
    >>> states.poll(90001, 2) == STOP_WHEN   # stops at the next check
    True
    >>> states.close(90001)
  """

  def __init__(self, lib):
    self._lib = lib

  @property
  def native(self) -> bool:
    """Whether the compiled check calls these states without Python (the
    library's FFI handler is registered: ``emission.route``'s column)."""
    return stop_states_library.LIBRARY.ffi

  def open(self, handle: int, group: int, stop: Stop) -> None:
    """Opens ``handle`` in ``group`` (an invocation; its first handle fixes
    the group's time limit, from now); an interruptible loop takes Ctrl-C
    from here until ``end`` (the first such loop running installs the
    SIGINT handler, from any thread)."""
    limit = stop.time_limit
    self._lib.gil_held.hostcall_control_open(
        handle, group,
        -1 if limit is None or limit * 1e6 >= MAX_LIMIT_US
        else int(limit * 1e6), int(stop.interruptible),
        int(stop.stop_when is not None))

  def end(self, handle: int) -> None:
    """``handle``'s loop no longer runs: it takes no more Ctrl-C (the
    handler it replaced is put back once none runs)."""
    self._lib.gil_held.hostcall_control_end(handle)

  def running(self, handle: int) -> bool:
    """Whether ``handle``'s loop still runs (opened, not ended or
    closed)."""
    return bool(self._lib.gil_held.hostcall_control_running(handle))

  def contain(self, handle: int, group: int) -> bool:
    """Where ``handle``'s loop still runs, asks ``group`` to stop for a
    failure (``FAILED``) and says True; False where the loop has ended
    (atomically with a device's own finish, ``finish_here``)."""
    return bool(self._lib.gil_held.hostcall_control_contain(handle, group))

  def close(self, handle: int) -> None:
    """Forgets ``handle`` (and its group with its last handle)."""
    self._lib.gil_held.hostcall_control_close(handle)

  def hold(self, group: int) -> None:
    """Keeps ``group`` (opened by a handle) after its last handle closes,
    until ``release``: a device of the invocation that opens after its
    peers closed joins it, and stops after the same check."""
    self._lib.gil_held.hostcall_control_hold(group)

  def release(self, group: int) -> None:
    """Every device of ``group``'s invocation has closed (or never will):
    it is forgotten with its last handle."""
    self._lib.gil_held.hostcall_control_release(group)

  def request(self, group: int, reason: int) -> None:
    """Asks ``group`` to stop for ``reason`` (a predicate said so, or a
    contained failure: which outranks a reason asked before it)."""
    self._lib.gil_held.hostcall_control_request(group, reason)

  def evaluated(self, handle: int) -> None:
    """The predicate has seen one more tick of ``handle``."""
    self._lib.gil_held.hostcall_control_evaluated(handle)

  def poll(self, handle: int, check: int) -> int:
    """The check: 0 to go on, else the reason to stop. A loop with a
    predicate waits (up to ``PREDICATE_WAIT``) until the predicate has
    seen the chunk before."""
    # Through the library that releases the GIL: the check may wait for
    # the delivery thread to run the predicate.
    return int(self._lib.hostcall_control_poll(handle, check))

  def interrupts(self) -> int:
    """SIGINTs taken for interruptible loops so far."""
    return int(self._lib.gil_held.hostcall_control_interrupts())

  def sigint_installed(self) -> bool:
    """Whether hostcall's SIGINT handler is installed now."""
    return bool(self._lib.gil_held.hostcall_control_sigint_installed())


def choose() -> StopStates:
  """The process's stop states (loading the library: raises
  ``HostcallNativeError`` where the extension cannot be loaded).

  Example:
    >>> from hostcall._apps.control import states
    >>> isinstance(states.choose(), states.StopStates)
    True
  """
  return StopStates(stop_states_library.load())
