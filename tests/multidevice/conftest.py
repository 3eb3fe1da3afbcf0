from tests.conftest import (  # noqa: F401
    Recorder, _no_leftover_tap_errors, recorder, stream)
