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
