"""Mutual TLS between Iris's services: one certificate per role, checked per method.

- `roles`: the roles, how a certificate names its role, and which role may call which RPC;
- `credentials`: `TLSFiles` (cert, key and CA paths from a service's settings) and the
  grpc server / channel credentials made from them;
- `interceptor`: the server interceptor every service installs, refusing a caller whose
  certificate's role may not call the method (PERMISSION_DENIED).

Without TLS files everything stays plaintext (the default, e.g. `iris up` on loopback).
"""

from iris.mtls.credentials import TLSFiles, aio_channel, sync_channel
from iris.mtls.interceptor import RoleCheck, role_interceptors
from iris.mtls.roles import ROLES, role_hostname, role_uri

__all__ = [
    "ROLES",
    "RoleCheck",
    "TLSFiles",
    "aio_channel",
    "role_hostname",
    "role_interceptors",
    "role_uri",
    "sync_channel",
]
