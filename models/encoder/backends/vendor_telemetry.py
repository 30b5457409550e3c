"""OpenVINO's usage telemetry, declined in this process.

openvino_telemetry (behind OpenVINO's model converter and NNCF) honours no DO_NOT_TRACK: with no consent file under
``~/intel`` it sends Google Analytics an event per converted operation, each from a forked copy of the process
that waits for the network. nightscore promises no telemetry and runs offline, so every consent check in this
process answers "declined". The user's consent file is neither read nor written.
"""

from __future__ import annotations

import functools


@functools.cache
def decline() -> None:
    """Make openvino_telemetry's consent checks in this process answer "declined" (once; a no-op without it)."""
    try:
        from openvino_telemetry import Telemetry
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        return

    def declined(self: OptInChecker, enable_opt_in_dialog: bool, disable_in_ci: bool = False) -> ConsentCheckResult:
        return ConsentCheckResult.DECLINED

    OptInChecker.check = declined
    made = getattr(Telemetry, "_SingletonMetaClass__single_instance", None)  # one made before this call
    if made is not None:
        made.consent = False
