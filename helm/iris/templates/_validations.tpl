{{/*
Combinations of values the schema cannot express. Each failure names the value's path.
Included once, from templates/validate.yaml.
*/}}
{{- define "iris.validate" -}}
{{- $v := .Values }}
{{- if and (eq $v.model.source "pvc") (not $v.model.pvc.claimName) }}
{{- fail "model.pvc.claimName is required when model.source is pvc" }}
{{- end }}
{{- if and (eq $v.model.source "hostPath") (not $v.model.hostPath.path) }}
{{- fail "model.hostPath.path is required when model.source is hostPath" }}
{{- end }}
{{- if and (eq $v.model.source "image") (not $v.model.image.repository) }}
{{- fail "model.image.repository is required when model.source is image" }}
{{- end }}
{{- if and (eq $v.cache.store "redis") (not $v.redis.enabled) (not $v.redis.external.url) }}
{{- fail "redis.external.url is required when cache.store is redis and redis.enabled is false" }}
{{- end }}
{{- if and (eq $v.cache.store "redis-cluster") (not $v.redisCluster.nodes) }}
{{- fail "redisCluster.nodes (host:port seeds of an existing cluster) is required when cache.store is redis-cluster" }}
{{- end }}
{{- if and (eq $v.cache.store "redis-cluster") $v.redis.enabled }}
{{- fail "redis.enabled must be false when cache.store is redis-cluster (the cache uses redisCluster.nodes, not the chart's Redis)" }}
{{- end }}
{{- if and (eq $v.cache.store "memory") (gt (int $v.cache.replicas) 1) }}
{{- fail (printf "cache.replicas is %d but cache.store memory keeps entries in one pod: use 1, or cache.store redis" (int $v.cache.replicas)) }}
{{- end }}
{{- if and $v.autoscaler.enabled (not $v.operator.enabled) }}
{{- fail "autoscaler.enabled needs operator.enabled (nothing else acts on an IrisAutoscaler)" }}
{{- end }}
{{- range $component := list "llm" "encoder" }}
{{- $spec := index $v.autoscaler $component }}
{{- if and $v.autoscaler.enabled (gt (int $spec.minReplicas) (int $spec.maxReplicas)) }}
{{- fail (printf "autoscaler.%s.minReplicas (%d) is above autoscaler.%s.maxReplicas (%d)" $component (int $spec.minReplicas) $component (int $spec.maxReplicas)) }}
{{- end }}
{{- end }}
{{- if and $v.gateway.apiKeys.existingSecret $v.gateway.apiKeys.keys }}
{{- fail "gateway.apiKeys: set existingSecret or keys, not both" }}
{{- end }}
{{- if and $v.redis.enabled $v.redis.auth.existingSecret $v.redis.auth.password }}
{{- fail "redis.auth: set existingSecret or password, not both" }}
{{- end }}
{{- if and $v.redis.external.existingSecret (not $v.redis.external.url) }}
{{- fail "redis.external.existingSecret is set but redis.external.url is empty" }}
{{- end }}
{{- $kv := $v.kvStore }}
{{- if $kv.enabled }}
{{- if le (int64 ($v.llm.hostKVBytes | default 0)) 0 }}
{{- fail "kvStore.enabled needs llm.hostKVBytes > 0: the LLM pods load the store's pages into their host KV tier (e.g. llm.hostKVBytes=68719476736 for 64 GiB)" }}
{{- end }}
{{- if gt (int $v.llm.tensorParallelSize) 1 }}
{{- fail (printf "kvStore.enabled needs llm.tensorParallelSize 1 (got %d): the store is not supported under tensor parallelism" (int $v.llm.tensorParallelSize)) }}
{{- end }}
{{- if and (eq $kv.mode "redis") (not $kv.deploy) (not $kv.external.url) }}
{{- fail "kvStore.external.url is required when kvStore.mode is redis and kvStore.deploy is false" }}
{{- end }}
{{- if and (eq $kv.mode "redis-cluster") (not $kv.cluster.nodes) }}
{{- fail "kvStore.cluster.nodes (host:port seeds of an existing cluster) is required when kvStore.mode is redis-cluster" }}
{{- end }}
{{- if and $kv.auth.existingSecret $kv.auth.password }}
{{- fail "kvStore.auth: set existingSecret or password, not both" }}
{{- end }}
{{- end }}
{{- end }}
