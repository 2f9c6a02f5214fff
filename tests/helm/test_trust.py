"""The chart's trust settings: API keys required by default (a generated key in a Secret),
per-key rate limits, and mutual TLS with one cert-manager Certificate per role.

Keeping a generated key across upgrades cannot be verified without a cluster: the Secret
template reuses the key it finds through `lookup`, and `lookup` returns nothing under
`helm template` (every render here generates a fresh key, as the last test shows).
"""

from __future__ import annotations

import base64
import json
import shutil

import pytest
import yaml

from iris.mtls import ROLES, role_hostname, role_uri
from tests.helm.cert_manager import validate_cert_manager
from tests.helm.chart import CHART, RELEASE, by_kind, containers, env_of, run_helm, workloads

SERVICE_ROLES = [role for role in ROLES if role != "admin"]  # admin: an operator's own cert
SECRET = f"{RELEASE}-iris-gateway-api-keys"


def keys_in(secret: dict, key: str = "api-keys") -> list[str]:
    return json.loads(base64.b64decode(secret["data"][key]))


def test_the_default_release_requires_a_generated_api_key(render):
    manifests = render()
    secret = by_kind(manifests, "Secret")[SECRET]
    (key,) = keys_in(secret)
    assert key.startswith("sk-iris-") and len(key) == len("sk-iris-") + 40
    gateway = containers(workloads(manifests)["gateway"], init=False)[0]
    source = env_of(gateway)["IRIS_GATEWAY_API_KEYS"]["valueFrom"]["secretKeyRef"]
    assert source == {"name": SECRET, "key": "api-keys"}


def test_per_key_rate_limits_reach_the_gateway(render):
    gateway = containers(workloads(render())["gateway"], init=False)[0]
    env = {name: entry.get("value") for name, entry in env_of(gateway).items()}
    # Per deployment; the default's two replicas each enforce half.
    assert env["IRIS_GATEWAY_KEY_REQUESTS_PER_S"] == "10"
    assert env["IRIS_GATEWAY_KEY_PROMPT_TOKENS_PER_S"] == "25000"


def test_an_open_gateway_must_be_asked_for(render):
    manifests = render("default", "--set", "gateway.apiKeys.required=false")
    assert SECRET not in by_kind(manifests, "Secret")
    gateway = containers(workloads(manifests)["gateway"], init=False)[0]
    assert "IRIS_GATEWAY_API_KEYS" not in env_of(gateway)


def test_listed_keys_go_into_the_secret_as_given(render):
    manifests = render("full")
    secret = by_kind(manifests, "Secret")["iris-full-gateway-api-keys"]
    assert keys_in(secret, "keys") == ["key-one", "key-two"]
    assert "annotations" not in secret["metadata"]  # not generated


def test_without_tls_nothing_of_cert_manager_renders(render):
    manifests = render()
    assert not [doc for doc in manifests if doc["apiVersion"].startswith("cert-manager.io")]
    for component in SERVICE_ROLES:
        for container in containers(workloads(manifests)[component], init=False):
            assert not [name for name in env_of(container) if "_TLS_" in name]


@pytest.fixture(scope="module")
def tls_manifests(render):
    return render("default", "--set", "tls.enabled=true")


def test_tls_renders_a_ca_and_one_certificate_per_role(tls_manifests):
    issuers = by_kind(tls_manifests, "Issuer")
    certificates = by_kind(tls_manifests, "Certificate")
    assert issuers[f"{RELEASE}-iris-selfsigned"]["spec"] == {"selfSigned": {}}
    assert issuers[f"{RELEASE}-iris-ca"]["spec"] == {"ca": {"secretName": f"{RELEASE}-iris-ca"}}
    ca = certificates[f"{RELEASE}-iris-ca"]["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == f"{RELEASE}-iris-selfsigned"
    for role in SERVICE_ROLES:
        spec = certificates[f"{RELEASE}-iris-{role}-tls"]["spec"]
        assert spec["uris"] == [role_uri(role)]  # the role servers read (iris/mtls)
        assert spec["dnsNames"][0] == role_hostname(role)  # the name clients check
        assert {"server auth", "client auth"} <= set(spec["usages"])
        assert spec["issuerRef"] == {
            "name": f"{RELEASE}-iris-ca",
            "kind": "Issuer",
            "group": "cert-manager.io",
        }
    assert len(certificates) == 1 + len(SERVICE_ROLES)


def test_cert_manager_objects_validate_against_the_cert_manager_schema(tls_manifests):
    objects = [doc for doc in tls_manifests if doc["apiVersion"] == "cert-manager.io/v1"]
    assert len(objects) == 7
    for manifest in objects:
        validate_cert_manager(manifest)
    # The check has teeth: a misspelt field and a wrong enum value are both refused.
    role_certificate = by_kind(tls_manifests, "Certificate")[f"{RELEASE}-iris-llm-tls"]
    misspelt = json.loads(json.dumps(role_certificate))
    misspelt["spec"]["dnsName"] = misspelt["spec"].pop("dnsNames")
    with pytest.raises(ValueError, match="dnsName is not a field"):
        validate_cert_manager(misspelt)
    wrong = json.loads(json.dumps(role_certificate))
    wrong["spec"]["usages"] = ["server-auth"]
    with pytest.raises(ValueError, match="usages"):
        validate_cert_manager(wrong)


def test_each_service_mounts_its_role_certificate(tls_manifests):
    for role in SERVICE_ROLES:
        workload = workloads(tls_manifests)[role]
        (container,) = containers(workload, init=False)
        prefix = f"IRIS_{role.upper()}_TLS_"
        env = {name: entry["value"] for name, entry in env_of(container).items() if prefix in name}
        assert env == {
            prefix + "CERT_FILE": "/etc/iris/tls/tls.crt",
            prefix + "KEY_FILE": "/etc/iris/tls/tls.key",
            prefix + "CA_FILE": "/etc/iris/tls/ca.crt",
        }
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == f"{RELEASE}-iris-{role}-tls"
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/iris/tls", "readOnly": True}
        if role != "gateway":  # kubelet's gRPC probe has no TLS: readiness is /healthz
            assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_network_policies_stay_with_tls(render, tls_manifests):
    plain = sorted(by_kind(render(), "NetworkPolicy"))
    assert plain and sorted(by_kind(tls_manifests, "NetworkPolicy")) == plain


def test_a_given_issuer_signs_the_role_certificates(render):
    manifests = render("full")
    assert not by_kind(manifests, "Issuer")  # no chart CA
    certificates = by_kind(manifests, "Certificate")
    assert len(certificates) == len(SERVICE_ROLES)
    for certificate in certificates.values():
        assert certificate["spec"]["issuerRef"] == {
            "name": "corp-internal-ca",
            "kind": "ClusterIssuer",
            "group": "cert-manager.io",
        }
        assert certificate["spec"]["duration"] == "720h"


def test_the_schema_refuses_a_bad_issuer_kind(render_error):
    error = render_error("default", "--set", "tls.issuerRef.kind=Secret")
    assert "tls.issuerRef.kind" in error


def notes(helm, tmp_path, *extra: str) -> str:
    """NOTES.txt as `helm install` would print it: rendered through a copy of the chart in
    which a ConfigMap carries it (helm template does not render NOTES.txt)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-source.txt")
    (chart / "templates" / "notes-render.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ tpl (.Files.Get "notes-source.txt") . | toJson }}\n'
    )
    args = ["template", RELEASE, str(chart), "--namespace", "serving", *extra]
    result = run_helm(helm, *args, "--show-only", "templates/notes-render.yaml")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["data"]["notes"]


def test_notes_say_how_to_read_the_generated_key(helm, tmp_path):
    text = notes(helm, tmp_path)
    assert f"get secret {SECRET} -o jsonpath='{{.data.api-keys}}'" in text
    assert "generated one" in text and "cannot" in text  # and that `helm template` cannot keep it
    assert "mutual TLS" not in text
    open_text = notes(
        helm, tmp_path / "b", "--set", "gateway.apiKeys.required=false", "--set", "tls.enabled=true"
    )
    assert "requires no API key" in open_text
    assert "kubectl -n serving get certificates" in open_text


def test_helm_template_cannot_keep_a_generated_key(render):
    """Two renders, two keys: without a cluster, `lookup` finds no Secret to reuse. What an
    upgrade keeps is only checkable against a real API server."""
    first = keys_in(by_kind(render("default"), "Secret")[SECRET])
    second = keys_in(by_kind(render("default", "--set", "logLevel=INFO"), "Secret")[SECRET])
    assert first != second
