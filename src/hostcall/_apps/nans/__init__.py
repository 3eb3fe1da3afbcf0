"""``hostcall.find_nans``: the first NaN or infinity of a compiled
function, forward or backward, found on the device and reported from the
host, one concept a module, each importing only from those before it:

* ``found``: what a checked stretch found, as device values;
* ``sites``: the host side: each check's site, the report, what is done
  with it;
* ``region``: the checks of one stretch (a program, a loop's step, a
  branch), in the order they ran;
* ``structured``: nested ``jit``, ``scan``, ``while_loop``, ``cond`` and
  ``checkpoint`` rebuilt around checked bodies;
* ``interpreter``: a jaxpr evaluated again, each output checked;
* ``members``: a pass's one report, reduced over ``vmap`` members;
* ``checked``: ``find_nans`` itself, its backward pass a ``custom_vjp``.
"""

from hostcall._apps.nans.checked import find_nans
from hostcall._apps.nans.sites import NanReport

__all__ = ["NanReport", "find_nans"]
