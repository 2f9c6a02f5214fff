"""cert-manager.io/v1 Certificate and Issuer validation for the chart tests.

The schema comes from a package: `cloudcoil-models-cert-manager` ships pydantic models
generated from cert-manager's own CRDs (v1.17.1). Those models ignore unknown fields, so
a manifest is also required to survive a round trip unchanged: a misspelt or unknown
field is dropped by the model and shows up as a difference.
"""

from __future__ import annotations

KINDS = ("Certificate", "Issuer", "ClusterIssuer")


def _model(kind: str):
    from cloudcoil.models.cert_manager import v1

    return {"Certificate": v1.Certificate, "Issuer": v1.Issuer, "ClusterIssuer": v1.ClusterIssuer}[
        kind
    ]


def _differences(given, kept, path: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        found = []
        for key, value in given.items():
            if key not in kept:
                found.append(f"{path}.{key} is not a field of the schema")
            else:
                found += _differences(value, kept[key], f"{path}.{key}")
        return found
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        return [
            d
            for i, (a, b) in enumerate(zip(given, kept, strict=True))
            for d in _differences(a, b, f"{path}[{i}]")
        ]
    return [] if given == kept else [f"{path}: {given!r} became {kept!r}"]


def validate_cert_manager(manifest: dict) -> None:
    """Raise ValueError naming what is wrong with a cert-manager.io/v1 object."""
    if manifest.get("apiVersion") != "cert-manager.io/v1":
        raise ValueError(f"apiVersion {manifest.get('apiVersion')!r} is not cert-manager.io/v1")
    model = _model(manifest["kind"]).model_validate(manifest)  # pydantic.ValidationError
    kept = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    problems = _differences(manifest, kept)
    if problems:
        raise ValueError("; ".join(problems))
