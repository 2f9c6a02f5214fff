{{/*
Mutual TLS between the services (iris/mtls), when tls.enabled: each role's certificate
(cert-manager, templates/tls/certificates.yaml) is a Secret with tls.crt, tls.key and
ca.crt, mounted at /etc/iris/tls and named by IRIS_<SERVICE>_TLS_*_FILE.
*/}}
{{- define "iris.tls.secretName" -}}
{{- printf "%s-tls" (include "iris.componentName" (list (index . 0) (index . 1))) }}
{{- end }}

{{/* Usage: include "iris.tls.env" (list $ "ENCODER") */}}
{{- define "iris.tls.env" -}}
{{- $root := index . 0 }}
{{- $prefix := printf "IRIS_%s_" (index . 1) }}
{{- if $root.Values.tls.enabled }}
- name: {{ $prefix }}TLS_CERT_FILE
  value: /etc/iris/tls/tls.crt
- name: {{ $prefix }}TLS_KEY_FILE
  value: /etc/iris/tls/tls.key
- name: {{ $prefix }}TLS_CA_FILE
  value: /etc/iris/tls/ca.crt
{{- end }}
{{- end }}

{{- define "iris.tls.volumeMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/iris/tls
  readOnly: true
{{- end }}
{{- end }}

{{/* Usage: include "iris.tls.volume" (list $ "encoder") */}}
{{- define "iris.tls.volume" -}}
{{- $root := index . 0 }}
{{- if $root.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "iris.tls.secretName" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* The Issuer that signs the role certificates: the given one, else the chart's own CA. */}}
{{- define "iris.tls.issuerRef" -}}
{{- if .Values.tls.issuerRef.name }}
name: {{ .Values.tls.issuerRef.name }}
kind: {{ .Values.tls.issuerRef.kind | default "Issuer" }}
group: cert-manager.io
{{- else }}
name: {{ include "iris.componentName" (list . "ca") }}
kind: Issuer
group: cert-manager.io
{{- end }}
{{- end }}
