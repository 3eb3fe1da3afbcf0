"""What people build on host callbacks, built on hostcall's own core:
loop-buffered calls (``scan``), progress bars (``progress``, ``bar_events``,
``bar_options``, ``bars``), metric logging, its writers and plots of logged
runs (the ``metrics`` package), loops the host can stop (the ``control``
package, ``steering``)."""
