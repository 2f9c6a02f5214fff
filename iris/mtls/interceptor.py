"""The one server interceptor of every Iris gRPC service: the caller's role, read from its
client certificate, must be allowed the method (roles.POLICY), else PERMISSION_DENIED.

The TLS handshake has already refused a caller without a certificate signed by the CA; this
refuses a genuine certificate of the wrong role (a pod storing embeddings, an encoder
asking for generations). gRPC's interceptor sees only the method name, so the check runs
inside the wrapped handler, where the peer's auth context is known.
"""

from __future__ import annotations

import functools
import inspect
import logging

import grpc

from iris.mtls.credentials import TLSFiles
from iris.mtls.roles import OPEN_PREFIXES, allowed, role_from_sans

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=256)
def _role_of_pem(pem: bytes) -> str | None:
    from cryptography import x509

    try:
        certificate = x509.load_pem_x509_certificate(pem)
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, x509.ExtensionNotFound):
        return None
    return role_from_sans(names.value.get_values_for_type(x509.UniformResourceIdentifier))


def caller_role(context) -> str | None:
    """The role named by the peer's client certificate (None without one)."""
    pems = context.auth_context().get("x509_pem_cert") or []
    return _role_of_pem(pems[0]) if pems else None


def _refusal(method: str, role: str | None) -> str:
    who = f"role {role!r}" if role else "a caller without an Iris role certificate"
    return f"{who} may not call {method}"


class RoleCheck(grpc.aio.ServerInterceptor):
    """Wrap each handler so it first checks the caller's role for its method."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_PREFIXES):
            return handler
        return _guarded(handler, handler_call_details.method)


async def _check(method: str, context) -> None:
    role = caller_role(context)
    if not allowed(method, role):
        log.warning("refused %s to %s (peer %s)", method, role or "no role", context.peer())
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, _refusal(method, role))


def _guarded(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    if handler.unary_unary is not None:
        behavior, make = handler.unary_unary, grpc.unary_unary_rpc_method_handler
    elif handler.unary_stream is not None:
        behavior, make = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    elif handler.stream_unary is not None:
        behavior, make = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    else:
        behavior, make = handler.stream_stream, grpc.stream_stream_rpc_method_handler

    if inspect.isasyncgenfunction(behavior):

        async def checked(request, context):
            await _check(method, context)
            async for response in behavior(request, context):
                yield response

    else:

        async def checked(request, context):
            await _check(method, context)
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result

    return make(
        checked,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def role_interceptors(tls: TLSFiles | None) -> list[grpc.aio.ServerInterceptor]:
    """What a service's grpc.aio.server(interceptors=...) gets: the role check under
    mutual TLS, nothing in plaintext."""
    return [RoleCheck()] if tls is not None and tls.enabled else []
