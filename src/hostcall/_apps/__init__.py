"""What people build on host callbacks, built on hostcall's own core, one
package a concept: the chunked-loop engine that bars and steered loops
share (``loops``), loop-buffered calls (``scan``, over the engine's
buffering), progress bars (the ``progress`` package), metric logging, its
writers and plots of logged runs (the ``metrics`` package), loops the host
can stop (the ``control`` package)."""
