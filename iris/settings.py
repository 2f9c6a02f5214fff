"""Base for the one pydantic-settings `Settings` class each service defines.

Each service subclasses `ServiceSettings` with its own env prefix (``IRIS_CACHE_``,
``IRIS_LLM_``...). Settings are read and validated once, at start; a bad value fails with
the key's name in the message. Peer addresses are lists of ``host:port`` strings, given in
the environment as JSON (``'["a:1","b:2"]'``) or comma-separated (``a:1,b:2``).
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationError, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def validation_message(error: ValidationError, where: str) -> str:
    """One line per problem of a pydantic error: `where.field[index]: value: what is wrong`."""
    problems = []
    for item in error.errors():
        path = where
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        value = "" if item["type"] == "missing" else f" {item['input']!r}:"
        problems.append(f"{path}:{value} {item['msg']}")
    return "; ".join(problems)


class SettingsError(ValueError):
    """A setting failed validation; the message names every bad key and why."""


def parse_address(value: str) -> str:
    """Check one ``host:port`` peer address and return it normalised (stripped)."""
    text = value.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"peer address {value!r} is not host:port")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"peer address {value!r} has port {port!r}, expected 1..65535")
    return text


def split_list(value: Any) -> Any:
    """A list setting from the environment: a JSON list or comma-separated text (an IPv6
    address such as ``[::1]:80`` is text, not JSON). Lists pass through unchanged."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]") and not text.startswith("[:"):
            import json

            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def _split_addresses(value: Any) -> Any:
    value = split_list(value)
    if isinstance(value, (list, tuple)):
        return [parse_address(str(item)) for item in value]
    return value


# NoDecode: the raw env string reaches the validator, which accepts both JSON and CSV.
AddressList = Annotated[list[str], NoDecode, BeforeValidator(_split_addresses)]
StringList = Annotated[list[str], NoDecode, BeforeValidator(split_list)]


class ServiceSettings(BaseSettings):
    """Common fields; subclasses set ``model_config = SettingsConfigDict(env_prefix=...)``."""

    model_config = SettingsConfigDict(env_prefix="IRIS_", extra="forbid", validate_default=True)

    host: str = "127.0.0.1"
    log_level: str = "INFO"
    otlp_endpoint: str | None = None  # falls back to OTEL_EXPORTER_OTLP_ENDPOINT

    @classmethod
    def _refuse_unknown_env(cls) -> None:
        # pydantic-settings ignores an env var with our prefix that names no field, so a
        # misspelt IRIS_LLM_PAGESIZE would silently run with the default: refuse it instead.
        prefix = cls.model_config.get("env_prefix", "").upper()
        if not prefix or prefix == "IRIS_":
            return
        known = {name.upper() for name in cls.model_fields}
        unknown = sorted(
            key
            for key in os.environ
            if key.upper().startswith(prefix) and key.upper()[len(prefix) :] not in known
        )
        if unknown:
            raise SettingsError(
                f"invalid {cls.__name__}: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(prefix + name for name in known))}"
            )

    @classmethod
    def load(cls, **overrides: Any):
        """Read the environment (plus explicit overrides) and validate; raise SettingsError."""
        clean = {key: value for key, value in overrides.items() if value is not None}
        cls._refuse_unknown_env()
        try:
            return cls(**clean)
        except ValidationError as err:
            prefix = cls.model_config.get("env_prefix", "")
            problems = []
            for error in err.errors():
                key = ".".join(str(part) for part in error["loc"]) or "<settings>"
                env_key = f"{prefix}{key}".upper()
                problems.append(f"{key} (env {env_key}): {error['msg']}")
            raise SettingsError(f"invalid {cls.__name__}: " + "; ".join(problems)) from None


class GrpcServiceSettings(ServiceSettings):
    """A service that speaks gRPC to its peers: with all three PEM paths set, it serves and
    calls over mutual TLS with its role's certificate (iris/mtls); with none, plaintext."""

    tls_cert_file: str | None = None  # this role's certificate (PEM)
    tls_key_file: str | None = None  # its private key (PEM)
    tls_ca_file: str | None = None  # the CA that signs every role's certificate (PEM)

    @model_validator(mode="after")
    def _tls_complete(self):
        from iris.mtls import TLSFiles

        TLSFiles.of(self)  # all three or none: raises naming the missing ones
        return self

    def tls(self):
        """These settings' TLS files (iris.mtls.TLSFiles; `.enabled` is False in plaintext)."""
        from iris.mtls import TLSFiles

        return TLSFiles.of(self)
