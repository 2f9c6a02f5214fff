{{/* Pieces of templates/networkpolicies.yaml. */}}

{{/* Egress every Iris pod needs: DNS, and the OTLP endpoint when one is set. */}}
{{- define "iris.np.baseEgress" -}}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
  {{- with .Values.networkPolicy.dns.peers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- with .Values.telemetry.otlpEndpoint }}
- ports:
    - port: {{ include "iris.urlPort" (list . "4317") }}
      protocol: TCP
  {{- with $.Values.networkPolicy.otlpPeers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/* Egress to the Kubernetes API server (its address is outside any pod selector). */}}
{{- define "iris.np.kubeApiEgress" -}}
- to:
    {{- range .Values.networkPolicy.kubeApi.cidrs }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  ports:
    {{- range .Values.networkPolicy.kubeApi.ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- end }}

{{/* The LLM pods' egress to their KV store: the chart's pod, or an external store's (or
cluster's seeds') ports, to networkPolicy.externalKVStorePeers ([] = any destination). */}}
{{- define "iris.np.kvStoreEgress" -}}
{{- $k := .Values.kvStore }}
{{- if include "iris.kvStoreDeployed" . }}
- to:
    - {{ include "iris.componentPeer" (list . "kv-store") | nindent 6 | trim }}
  ports:
    - port: {{ $k.port }}
      protocol: TCP
{{- else }}
{{- $ports := list }}
{{- if eq $k.mode "redis-cluster" }}
{{- range $k.cluster.nodes }}
{{- $ports = append $ports (regexFind "[0-9]+$" .) }}
{{- end }}
{{- else }}
{{- $ports = append $ports (include "iris.urlPort" (list $k.external.url "6379")) }}
{{- end }}
- ports:
    {{- range uniq $ports }}
    - port: {{ int . }}
      protocol: TCP
    {{- end }}
  {{- with .Values.networkPolicy.externalKVStorePeers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}
