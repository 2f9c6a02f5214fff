{{/*
Names, labels and the pieces every Iris pod shares (image, env, security, scratch mounts).
*/}}

{{- define "iris.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-wide prefix; components append "-<component>", so it stays short. */}}
{{- define "iris.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "iris.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "iris.selectorLabels" -}}
app.kubernetes.io/name: {{ include "iris.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "iris.labels" -}}
helm.sh/chart: {{ include "iris.chart" . }}
{{ include "iris.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: iris
{{- end }}

{{/* Usage: include "iris.componentName" (list $ "gateway") */}}
{{- define "iris.componentName" -}}
{{- printf "%s-%s" (include "iris.fullname" (index . 0)) (index . 1) }}
{{- end }}

{{- define "iris.componentSelectorLabels" -}}
{{ include "iris.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "iris.componentLabels" -}}
{{ include "iris.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* A NetworkPolicy peer: this release's pods of one component. */}}
{{- define "iris.componentPeer" -}}
podSelector:
  matchLabels:
    {{- include "iris.componentSelectorLabels" . | nindent 4 }}
{{- end }}

{{- define "iris.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create }}
{{- default (include "iris.componentName" (list . "gateway")) .Values.gateway.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.gateway.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "iris.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "iris.componentName" (list . "operator")) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image of a component. Usage: include "iris.image" (list $ .Values.encoder.image "gpu").
GPU components run the CUDA build (tag), the others the CPU build (tag + cpuTagSuffix).
*/}}
{{- define "iris.image" -}}
{{- $root := index . 0 }}
{{- $override := index . 1 }}
{{- $variant := index . 2 }}
{{- $repository := default $root.Values.image.repository $override.repository }}
{{- $tag := default $root.Chart.AppVersion $root.Values.image.tag }}
{{- if eq $variant "cpu" }}
{{- $tag = printf "%s%s" $tag $root.Values.image.cpuTagSuffix }}
{{- end }}
{{- printf "%s:%s" $repository (default $tag $override.tag) }}
{{- end }}

{{- define "iris.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "iris.podSecurityContext" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{- define "iris.containerSecurityContext" -}}
securityContext:
  {{- toYaml .Values.containerSecurityContext | nindent 2 }}
{{- end }}

{{/* The model directory as the services see it. */}}
{{- define "iris.modelPath" -}}
{{- if .Values.model.subPath }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (trimPrefix "/" .Values.model.subPath) }}
{{- else }}
{{- .Values.model.mountPath }}
{{- end }}
{{- end }}

{{/* Env shared by every Iris container. Usage: include "iris.commonEnv" (list $ "CACHE") */}}
{{- define "iris.commonEnv" -}}
{{- $root := index . 0 }}
{{- $prefix := printf "IRIS_%s_" (index . 1) -}}
- name: {{ $prefix }}HOST
  value: "0.0.0.0"
- name: {{ $prefix }}LOG_LEVEL
  value: {{ $root.Values.logLevel | quote }}
{{- with $root.Values.telemetry.otlpEndpoint }}
- name: {{ $prefix }}OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
# The root filesystem is read-only: every cache a library may write goes to the scratch
# mounts (Triton's kernel cache, torch inductor, Hugging Face, Python's home).
- name: HOME
  value: /tmp
- name: TRITON_CACHE_DIR
  value: /var/cache/iris/triton
- name: TORCHINDUCTOR_CACHE_DIR
  value: /var/cache/iris/inductor
- name: HF_HOME
  value: /var/cache/iris/huggingface
- name: HF_HUB_OFFLINE
  value: "1"
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}

{{- define "iris.scratchVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /var/cache/iris
{{- end }}

{{- define "iris.scratchVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.scratch.tmpSizeLimit }}
- name: cache
  emptyDir:
    sizeLimit: {{ .Values.scratch.cacheSizeLimit }}
{{- end }}

{{- define "iris.modelVolumeMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}

{{- define "iris.modelVolume" -}}
- name: model
{{- if eq .Values.model.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
  hostPath:
    path: {{ .Values.model.hostPath.path }}
    type: {{ .Values.model.hostPath.type }}
{{- else }}
  emptyDir:
    sizeLimit: {{ .Values.model.image.sizeLimit }}
{{- end }}
{{- end }}

{{/* source=image: copy the model out of its image into the pod's emptyDir, then start. */}}
{{- define "iris.modelInitContainers" -}}
{{- if eq .Values.model.source "image" -}}
initContainers:
  - name: copy-model
    image: {{ printf "%s:%s" .Values.model.image.repository .Values.model.image.tag }}
    imagePullPolicy: {{ .Values.model.image.pullPolicy }}
    command:
      - cp
      - -R
      - {{ printf "%s/." (trimSuffix "/" .Values.model.image.path) }}
      - {{ .Values.model.mountPath }}
    {{- include "iris.containerSecurityContext" . | nindent 4 }}
    resources:
      {{- toYaml .Values.model.image.resources | nindent 6 }}
    volumeMounts:
      - name: model
        mountPath: {{ .Values.model.mountPath }}
{{- end }}
{{- end }}

{{/* Scheduling keys of a component's pod spec. Usage: include "iris.scheduling" .Values.llm */}}
{{- define "iris.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Container resources, plus nvidia.com/gpu for components that set gpus. */}}
{{- define "iris.resources" -}}
{{- $resources := deepCopy (.resources | default dict) }}
{{- if .gpus }}
{{- $limits := merge (dict "nvidia.com/gpu" .gpus) ($resources.limits | default dict) }}
{{- $requests := merge (dict "nvidia.com/gpu" .gpus) ($resources.requests | default dict) }}
{{- $_ := set $resources "limits" $limits }}
{{- $_ = set $resources "requests" $requests }}
{{- end -}}
resources:
  {{- toYaml $resources | nindent 2 }}
{{- end }}

{{/* The Redis URL the cache service connects to. */}}
{{- define "iris.redisURL" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s:%d/0" (include "iris.componentName" (list . "redis")) (int .Values.redis.port) }}
{{- else }}
{{- .Values.redis.external.url }}
{{- end }}
{{- end }}

{{/* The Secret (name, key) that holds the Redis password; empty name = no password. */}}
{{- define "iris.redisSecretName" -}}
{{- if .Values.redis.enabled }}
{{- default (include "iris.componentName" (list . "redis")) .Values.redis.auth.existingSecret }}
{{- else }}
{{- .Values.redis.external.existingSecret }}
{{- end }}
{{- end }}

{{- define "iris.redisSecretKey" -}}
{{- if .Values.redis.enabled }}
{{- .Values.redis.auth.secretKey }}
{{- else }}
{{- .Values.redis.external.secretKey }}
{{- end }}
{{- end }}

{{/* Non-empty when the chart runs the LLM pods' KV store (kvStore, mode redis, deploy). */}}
{{- define "iris.kvStoreDeployed" -}}
{{- $k := .Values.kvStore }}
{{- if and $k.enabled (eq $k.mode "redis") $k.deploy }}true{{ end }}
{{- end }}

{{/* The KV store's URL (mode redis): the chart's Service, or kvStore.external.url. */}}
{{- define "iris.kvStoreURL" -}}
{{- if include "iris.kvStoreDeployed" . }}
{{- printf "redis://%s:%d/0" (include "iris.componentName" (list . "kv-store")) (int .Values.kvStore.port) }}
{{- else }}
{{- .Values.kvStore.external.url }}
{{- end }}
{{- end }}

{{/* The Secret (name, key) that holds the KV store's password; empty name = none. */}}
{{- define "iris.kvStoreSecretName" -}}
{{- $k := .Values.kvStore }}
{{- if include "iris.kvStoreDeployed" . }}
{{- default (include "iris.componentName" (list . "kv-store")) $k.auth.existingSecret }}
{{- else if eq $k.mode "redis-cluster" }}
{{- $k.cluster.existingSecret }}
{{- else }}
{{- $k.external.existingSecret }}
{{- end }}
{{- end }}

{{- define "iris.kvStoreSecretKey" -}}
{{- $k := .Values.kvStore }}
{{- if include "iris.kvStoreDeployed" . }}
{{- $k.auth.secretKey }}
{{- else if eq $k.mode "redis-cluster" }}
{{- $k.cluster.secretKey }}
{{- else }}
{{- $k.external.secretKey }}
{{- end }}
{{- end }}

{{/* The port of a URL (http://h:4317, rediss://h:6380/0), or the default given. */}}
{{- define "iris.urlPort" -}}
{{- $url := index . 0 }}
{{- $default := index . 1 }}
{{- if not (contains "://" $url) }}
{{- $url = printf "http://%s" $url }}
{{- end }}
{{- $host := (urlParse $url).host }}
{{- if regexMatch ":[0-9]+$" $host }}
{{- regexFind "[0-9]+$" $host }}
{{- else }}
{{- $default }}
{{- end }}
{{- end }}

{{/* Non-empty when the gateway requires API keys: listed, in an existing Secret, or (the
default, apiKeys.required) generated by the chart. */}}
{{- define "iris.gatewayKeysRequired" -}}
{{- $k := .Values.gateway.apiKeys }}
{{- if or $k.existingSecret $k.keys $k.required }}true{{ end }}
{{- end }}

{{- define "iris.gatewaySecretName" -}}
{{- default (printf "%s-api-keys" (include "iris.componentName" (list . "gateway"))) .Values.gateway.apiKeys.existingSecret }}
{{- end }}

{{/* The gateway's tenancy: gateway.tenancy if set; else per-key when API keys are required
(keys handed to several clients imply isolation between them), shared when it is open. */}}
{{- define "iris.gatewayTenancy" -}}
{{- $t := .Values.gateway.tenancy }}
{{- if and $t (not (has $t (list "shared" "per-key"))) }}
{{- fail (printf "gateway.tenancy must be \"shared\", \"per-key\" or \"\" (got %q)" $t) }}
{{- end }}
{{- if $t }}{{ $t }}{{ else if include "iris.gatewayKeysRequired" . }}per-key{{ else }}shared{{ end }}
{{- end }}

{{/* One replica's share of a per-deployment rate: (list rate replicas) -> rate / replicas,
as a plain decimal (0 stays 0, no limit). */}}
{{- define "iris.share" -}}
{{- $rate := index . 0 }}{{- $replicas := index . 1 }}
{{- $share := divf $rate $replicas }}
{{- if eq $share (floor $share) }}{{ int64 $share }}{{ else }}{{ printf "%g" $share }}{{ end }}
{{- end }}
