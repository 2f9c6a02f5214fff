"""The one error type of the gateway: an HTTP status plus OpenAI's error body.

Intake, routing and dispatch raise `APIError`; the handlers in gateway/api/errors.py turn
it into `{"error": {"message", "type", "param", "code"}}`, so no route builds one by hand.
"""

from __future__ import annotations

import logging

from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    414: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "internal_error",
    502: "service_unavailable_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class APIError(Exception):
    """An error the client receives as an HTTP status plus the OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "invalid_request_error")

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        headers = dict(headers or {})
        if self.retry_after:
            headers["Retry-After"] = str(self.retry_after)
        return JSONResponse(self.body(), status_code=self.status, headers=headers or None)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def upstream_failure(
    status: int, public: str, *, code: str, request_id: str | None, detail: str
) -> APIError:
    """An error that arose behind the gateway (a pod, an encoder, the cache). The client's
    body says only `public` and the request id: no pod address, Redis host or gRPC detail
    reaches it. `detail`, which may hold all of those, goes to the log under the request id.
    """
    log.warning("%s [request %s]: %s", public, request_id or "-", detail)
    message = f"{public} (request id {request_id})" if request_id else public
    return APIError(status, message, code=code)
