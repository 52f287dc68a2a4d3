"""A request a front-end process decoded, at the engine: its checks before the service.

A front end decodes without the model's metadata (it has none), so the engine bounds
the declared shapes by the model (:func:`check_model_shapes`, in the words the
metadata-aware decode uses), authenticates, looks the model up once and attaches the
tenant and shared-memory inputs (:func:`begin_decoded`) before
``fast_infer.serve`` or ``InferenceService.infer_soon`` takes the request
(``server/engine_link.py``, ``server/grpc_link.py``).
"""

from __future__ import annotations

from sordino.inference import InferRequest
from sordino.protocol.validate import check_declared_shape
from sordino.server.fast_infer import Answer, admit, answer_error, open_request
from sordino.server.inference_parts import InferenceParts
from sordino.server.route import Route

__all__ = ["Ready", "begin_decoded", "check_model_shapes"]


def check_model_shapes(request: InferRequest, route: Route, room: int) -> None:
    """The model's bounds on the declared shapes, for a request decoded without them
    (the same check, in the same words, as :func:`decode_body` with the metadata)."""
    for name, array in request.inputs.items():
        check_declared_shape(
            name,
            array.shape,
            room=room,
            metadata=route.metadata,
            max_batch_size=route.max_batch_size,
        )
    for shared in request.shared_inputs:
        check_declared_shape(
            shared.name,
            shared.shape,
            room=max(room, shared.byte_size),
            metadata=route.metadata,
            max_batch_size=route.max_batch_size,
        )


class Ready:
    """A decoded request past the engine's checks (:func:`begin_decoded`): its route and
    whether it uses system shared memory; what the service step (:func:`serve`) takes."""

    __slots__ = ("route", "shared")

    def __init__(self, route: Route, shared: bool) -> None:
        self.route, self.shared = route, shared


def begin_decoded(
    parts: InferenceParts, request: InferRequest, read_s: float, room: int
) -> Ready | Answer | None:
    """The engine's checks of a request a front end decoded, before the service: its
    :class:`Ready` (authenticated, its model found, its shapes bounded, its tenant and
    shared-memory inputs attached), or the answer of the error that ends it (counted);
    None when the model's result cache is on, which keys on the body: the front end
    then sends the body (``answer_infer``). Never waits."""
    try:
        with parts.service.receiving(
            request.model, request.version, request.headers.get("x-sordino-tenant")
        ):
            tenant, route = open_request(
                parts, request.model, request.version, request.headers, read_s
            )
            if parts.result_cache.active(request.model):
                return None
            check_model_shapes(request, route, room)
            return Ready(route, admit(parts, request, tenant))
    except Exception as exc:
        return answer_error(exc, f"/v2/models/{request.model}/infer")
