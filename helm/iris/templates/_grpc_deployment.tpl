{{/*
The Deployment of a gRPC service (encoder, cache, llm): gRPC on "grpc", /metrics and
/healthz over HTTP on "metrics", the scratch mounts and, for model users, the model.
Usage: include "iris.grpcDeployment" (dict
  "root" $ "component" "encoder" "values" .Values.encoder "variant" "gpu"
  "model" true "autoscaled" true "env" (include "iris.encoder.env" $))
"shm" (a size), when given, mounts a memory-backed /dev/shm of that size (NCCL uses it).
A Deployment the operator scales renders no replicas, so an upgrade never undoes a scale.
*/}}
{{- define "iris.grpcDeployment" -}}
{{- $root := .root }}
{{- $component := .component }}
{{- $c := .values }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "iris.componentName" (list $root $component) }}
  labels:
    {{- include "iris.componentLabels" (list $root $component) | nindent 4 }}
spec:
  {{- if not .autoscaled }}
  replicas: {{ $c.replicas }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "iris.componentSelectorLabels" (list $root $component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "iris.componentLabels" (list $root $component) | nindent 8 }}
      {{- with $c.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      # These services never call the Kubernetes API.
      automountServiceAccountToken: false
      {{- with $c.terminationGracePeriodSeconds }}
      terminationGracePeriodSeconds: {{ . }}
      {{- end }}
      {{- with include "iris.imagePullSecrets" $root }}{{ . | trim | nindent 6 }}{{ end }}
      {{- include "iris.podSecurityContext" $root | nindent 6 }}
      {{- with include "iris.scheduling" $c }}{{ . | trim | nindent 6 }}{{ end }}
      {{- if .model }}
      {{- with include "iris.modelInitContainers" $root }}{{ . | trim | nindent 6 }}{{ end }}
      {{- end }}
      containers:
        - name: {{ $component }}
          image: {{ include "iris.image" (list $root $c.image .variant) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args: [{{ $component | quote }}]
          ports:
            - name: grpc
              containerPort: {{ $c.port }}
              protocol: TCP
            - name: metrics
              containerPort: {{ $c.metricsPort }}
              protocol: TCP
          env:
            {{- include "iris.commonEnv" (list $root (upper $component)) | nindent 12 }}
            - name: {{ printf "IRIS_%s_PORT" (upper $component) }}
              value: {{ $c.port | quote }}
            - name: {{ printf "IRIS_%s_METRICS_PORT" (upper $component) }}
              value: {{ $c.metricsPort | quote }}
            {{- include "iris.tls.env" (list $root (upper $component)) | nindent 12 }}
            {{- .env | nindent 12 }}
            {{- with $c.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- include "iris.containerSecurityContext" $root | nindent 10 }}
          {{- include "iris.resources" $c | nindent 10 }}
          {{- $startup := $c.startupProbe | default dict }}
          startupProbe:
            httpGet:
              path: /healthz
              port: metrics
            periodSeconds: {{ $startup.periodSeconds | default 5 }}
            failureThreshold: {{ $startup.failureThreshold | default 24 }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 3
          {{- if $root.Values.tls.enabled }}
          # kubelet's gRPC probe speaks no TLS: under mutual TLS, readiness is /healthz.
          readinessProbe:
            httpGet:
              path: /healthz
              port: metrics
          {{- else }}
          # Ready = the gRPC health service answers SERVING.
          readinessProbe:
            grpc:
              port: {{ $c.port }}
          {{- end }}
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          volumeMounts:
            {{- include "iris.scratchVolumeMounts" $root | nindent 12 }}
            {{- include "iris.tls.volumeMount" $root | nindent 12 }}
            {{- if .model }}
            {{- include "iris.modelVolumeMount" $root | nindent 12 }}
            {{- end }}
            {{- if .shm }}
            - name: shm
              mountPath: /dev/shm
            {{- end }}
      volumes:
        {{- include "iris.scratchVolumes" $root | nindent 8 }}
        {{- include "iris.tls.volume" (list $root $component) | nindent 8 }}
        {{- if .model }}
        {{- include "iris.modelVolume" $root | nindent 8 }}
        {{- end }}
        {{- if .shm }}
        - name: shm
          emptyDir:
            medium: Memory
            sizeLimit: {{ .shm }}
        {{- end }}
{{- end }}

{{/*
The Service of a gRPC component. Encoder and LLM Services are headless: the gateway
balances per pod (DNS or EndpointSlices), never through one ClusterIP connection.
Usage: include "iris.grpcService" (dict "root" $ "component" "llm" "values" .Values.llm "headless" true)
*/}}
{{- define "iris.grpcService" -}}
{{- $root := .root }}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "iris.componentName" (list $root .component) }}
  labels:
    {{- include "iris.componentLabels" (list $root .component) | nindent 4 }}
spec:
  type: ClusterIP
  {{- if .headless }}
  clusterIP: None
  {{- end }}
  selector:
    {{- include "iris.componentSelectorLabels" (list $root .component) | nindent 4 }}
  ports:
    - name: grpc
      port: {{ .values.port }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    - name: metrics
      port: {{ .values.metricsPort }}
      targetPort: metrics
      protocol: TCP
{{- end }}
