"""The one mechanism every hostcall flavour sits on.

``primitive`` defines ``hostcall_p`` and its transformation rules; ``host``
runs the user's function on the host with its context and keeps the errors that
taps raised until the next barrier.
"""

from hostcall._core.host import (
    CallbackException,
    CallContext,
    HostTarget,
    barrier,
)
from hostcall._core.modes import delivery, set_delivery
from hostcall._core.primitive import bind, hostcall_p

__all__ = [
    "CallContext",
    "CallbackException",
    "HostTarget",
    "barrier",
    "bind",
    "delivery",
    "set_delivery",
    "hostcall_p",
]
