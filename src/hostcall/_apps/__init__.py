"""What people build on host callbacks, built on hostcall's own core:
progress bars (``bars``, ``progress``), metric logging, its writers and
plots of logged runs (the ``metrics`` package), loops the host can stop
(``control``, ``steering``) and loop-buffered taps (``scan``)."""
