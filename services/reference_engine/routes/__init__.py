"""The reference engine's HTTP routes, one router per concern (assembled by
:func:`services.reference_engine.server.create_app`; the state is injected with
:data:`services.reference_engine.state.State`).

=================  ==================================================================
:mod:`.generate`   ``/generate`` (single, batch, SSE stream)
:mod:`.weights`    ``/update_weights_from_disk``, broadcast group, weight-update session,
                   distributed update, ``/get_weights_by_name``
:mod:`.control`    pause / continue / abort, ``/flush_cache``
:mod:`.info`       health, model info, weight version, load, server info
=================  ==================================================================
"""

from http import HTTPStatus

from fastapi.responses import JSONResponse


def error_response(message: str, status: int = HTTPStatus.BAD_REQUEST) -> JSONResponse:
    """SGLang's error shape for a request it rejects."""
    return JSONResponse({"error": {"message": message}}, status_code=status)
