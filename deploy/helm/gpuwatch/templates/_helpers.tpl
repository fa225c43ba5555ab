{{/*
The agent configuration text: .Values.config, or the shipped gpuwatch.toml (a copy of
deploy/kubernetes/base/gpuwatch.toml made by deploy/helm/sync.sh). Byte for byte what goes
into the ConfigMap.
*/}}
{{- define "gpuwatch.configText" -}}
{{ if .Values.config }}{{ .Values.config }}{{ else }}{{ .Files.Get "files/gpuwatch.toml" }}{{ end }}
{{- end -}}

{{/*
The ConfigMap's data entry of the config text, indented for a `data:` map at column 0. Blank
lines of the block scalar carry no indentation (no trailing spaces).
*/}}
{{- define "gpuwatch.configData" -}}
{{ "  " }}gpuwatch.toml: {{ regexReplaceAll "(?m)^ +$" (include "gpuwatch.configText" . | toYaml | indent 2 | trim) "" }}
{{- end -}}

{{/*
The pod and container security of the pods that only talk to the API server (the uninstall
cleanup, helm test): no host access, no root, nothing writable. apiClientPodSecurity is the pod's
securityContext, apiClientContainer the container's resources and securityContext.
*/}}
{{- define "gpuwatch.apiClientPodSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65534
  runAsGroup: 65534
  seccompProfile:
    type: RuntimeDefault
{{- end -}}
{{- define "gpuwatch.apiClientContainer" -}}
resources:
  requests:
    cpu: 10m
    memory: 32Mi
  limits:
    memory: 128Mi
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{/* A TOML table of the config as a map: absent is empty, anything but a table fails. */}}
{{- define "gpuwatch.table" -}}
{{- $v := index .map .key -}}
{{- if kindIs "invalid" $v -}}
{}
{{- else if kindIs "map" $v -}}
{{ toJson $v }}
{{- else -}}
{{ fail (printf "config: %s must be a table, got %v" .path $v) }}
{{- end -}}
{{- end -}}

{{/* A string setting of the config, with the agent's default when absent. */}}
{{- define "gpuwatch.string" -}}
{{- $v := index .map .key -}}
{{- if kindIs "invalid" $v -}}
{{ .default }}
{{- else if kindIs "string" $v -}}
{{ $v }}
{{- else -}}
{{ fail (printf "config: %s must be a string, got %v" .path $v) }}
{{- end -}}
{{- end -}}

{{/* A taint key, checked before it goes into tolerations and the admission policy's CEL. */}}
{{- define "gpuwatch.taintKey" -}}
{{- if not (regexMatch "^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" .key) -}}
{{ fail (printf "config: %s: %q is not a taint key (prefix/name)" .path .key) }}
{{- end -}}
{{ .key }}
{{- end -}}

{{/*
What the templates need from the agent configuration, as JSON (read it back with fromJson):
apiPort, stateDir, faultTaintKeys, startupTaintKey, readyConditionType,
problemConditionType, networkConditionType, eventNamespace, quarantineNamespace, prometheus. Absent settings take
the agent's defaults (collector/src/config.rs, kube/src/config.rs); settings the
DaemonSet cannot work with fail the render with the key named.
*/}}
{{- define "gpuwatch.settings" -}}
{{- $cfg := include "gpuwatch.configText" . | fromToml -}}
{{- if hasKey $cfg "Error" -}}
{{ fail (printf "config: not valid TOML: %s" $cfg.Error) }}
{{- end -}}
{{- $api := include "gpuwatch.table" (dict "map" $cfg "key" "api" "path" "[api]") | fromJson -}}
{{- $kube := include "gpuwatch.table" (dict "map" $cfg "key" "kube" "path" "[kube]") | fromJson -}}
{{- if eq (toString (index $api "enabled")) "false" -}}
{{ fail "config: [api] enabled = false: the kubelet's probes need the API" }}
{{- end -}}
{{- $out := dict "prometheus" (eq (toString (index $api "prometheus")) "true") -}}
{{- if eq .Values.mode "dcgmSidecar" -}}
{{- $_ := set $out "apiPort" (int .Values.dcgmSidecar.apiPort) -}}
{{- else -}}
{{- $listen := include "gpuwatch.string" (dict "map" $api "key" "listen" "path" "[api] listen" "default" "127.0.0.1:9400") -}}
{{- $port := regexFind ":[0-9]+$" $listen | trimPrefix ":" -}}
{{- if not $port -}}
{{ fail (printf "config: [api] listen = %q: expected an address like 0.0.0.0:9400" $listen) }}
{{- end -}}
{{- $host := trimSuffix (printf ":%s" $port) $listen -}}
{{- if or (hasPrefix "127." $host) (eq $host "localhost") (eq $host "[::1]") -}}
{{ fail (printf "config: [api] listen = %q is a loopback address (the agent's default when unset): the kubelet's probes reach the pod IP; set listen = \"0.0.0.0:%s\"" $listen $port) }}
{{- end -}}
{{- $_ := set $out "apiPort" (atoi $port) -}}
{{- end -}}
{{- $stateDir := include "gpuwatch.string" (dict "map" $cfg "key" "state_dir" "path" "state_dir" "default" "/var/lib/gpuwatch") -}}
{{- if not (hasPrefix "/" $stateDir) -}}
{{ fail (printf "config: state_dir = %q must be an absolute path" $stateDir) }}
{{- end -}}
{{- $_ := set $out "stateDir" $stateDir -}}
{{- $fault := include "gpuwatch.table" (dict "map" $kube "key" "fault_taint" "path" "[kube] fault_taint") | fromJson -}}
{{- $faultKey := include "gpuwatch.string" (dict "map" $fault "key" "key" "path" "[kube] fault_taint.key" "default" "gpuwatch.io/unhealthy") -}}
{{- $keys := list (include "gpuwatch.taintKey" (dict "key" $faultKey "path" "[kube] fault_taint.key")) -}}
{{- $actions := include "gpuwatch.table" (dict "map" $kube "key" "fault_taint_actions" "path" "[kube] fault_taint_actions") | fromJson -}}
{{- range $action := keys $actions | sortAlpha -}}
{{- $path := printf "[kube] fault_taint_actions.%s" $action -}}
{{- $t := include "gpuwatch.table" (dict "map" $actions "key" $action "path" $path) | fromJson -}}
{{- $k := include "gpuwatch.string" (dict "map" $t "key" "key" "path" (printf "%s.key" $path) "default" $faultKey) -}}
{{- $keys = append $keys (include "gpuwatch.taintKey" (dict "key" $k "path" (printf "%s.key" $path))) -}}
{{- end -}}
{{- $_ := set $out "faultTaintKeys" (uniq $keys) -}}
{{- $startup := include "gpuwatch.table" (dict "map" $kube "key" "startup_taint" "path" "[kube] startup_taint") | fromJson -}}
{{- $startupKey := include "gpuwatch.string" (dict "map" $startup "key" "key" "path" "[kube] startup_taint.key" "default" "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready") -}}
{{- $_ := set $out "startupTaintKey" (include "gpuwatch.taintKey" (dict "key" $startupKey "path" "[kube] startup_taint.key")) -}}
{{- $_ := set $out "readyConditionType" (include "gpuwatch.string" (dict "map" $kube "key" "ready_condition_type" "path" "[kube] ready_condition_type" "default" "AcceleratedHardwareReady")) -}}
{{- $_ := set $out "problemConditionType" (include "gpuwatch.string" (dict "map" $kube "key" "problem_condition_type" "path" "[kube] problem_condition_type" "default" "GPUProblem")) -}}
{{- $_ := set $out "networkConditionType" (include "gpuwatch.string" (dict "map" $kube "key" "network_condition_type" "path" "[kube] network_condition_type" "default" "NetworkProblem")) -}}
{{- $_ := set $out "eventNamespace" (include "gpuwatch.string" (dict "map" $kube "key" "event_namespace" "path" "[kube] event_namespace" "default" "default")) -}}
{{- $_ := set $out "quarantineNamespace" (include "gpuwatch.string" (dict "map" $kube "key" "quarantine_namespace" "path" "[kube] quarantine_namespace" "default" .Release.Namespace)) -}}
{{- range $k := list "readyConditionType" "problemConditionType" "networkConditionType" -}}
{{- if not (regexMatch "^[A-Za-z0-9][-A-Za-z0-9_.]*$" (index $out $k)) -}}
{{ fail (printf "config: [kube] %s = %q is not a condition type" ($k | snakecase) (index $out $k)) }}
{{- end -}}
{{- end -}}
{{- range $k := list "eventNamespace" "quarantineNamespace" -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (index $out $k)) -}}
{{ fail (printf "config: [kube] %s = %q is not a namespace name" ($k | snakecase) (index $out $k)) }}
{{- end -}}
{{- end -}}
{{ toJson $out }}
{{- end -}}

{{/*
The ConfigMap's name. Standalone: gpuwatch-config plus the content hash kustomize's
configMapGenerator appends, so a Helm install and an `apply -k` one name it alike and a config
change rolls the pods. The hash is kustomize 5's: sha256 of the JSON of {"data", "kind":
"ConfigMap", "name"} with an empty name (its lookup of metadata/name finds nothing), the first
10 hex digits with 0, 1, 3, a, e spelled g, h, k, m, t. The parity test
(kube/tests/it/helm_chart.rs) compares the names.
Sidecar: plain gpuwatch-config. The operator's DaemonSet mounts it and Helm does not manage
that DaemonSet: a hashed name would be deleted by the next upgrade while the DaemonSet still
names it, and every new dcgm-exporter pod would hang in ContainerCreating. The partial
DaemonSet's checksum/config annotation rolls the pods when it is re-applied.
*/}}
{{- define "gpuwatch.configMapName" -}}
{{- if eq .Values.mode "dcgmSidecar" -}}
gpuwatch-config
{{- else -}}
{{- $data := dict "gpuwatch.toml" (include "gpuwatch.configText" .) -}}
{{- $hash := dict "kind" "ConfigMap" "name" "" "data" $data | toJson | sha256sum | trunc 10 -}}
gpuwatch-config-{{ $hash | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" }}
{{- end -}}
{{- end -}}

{{/* Labels on every object the chart owns. */}}
{{- define "gpuwatch.labels" -}}
app.kubernetes.io/name: gpuwatch
app.kubernetes.io/part-of: gpuwatch
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The chart's labels with .extra merged over them (one key, one value: no duplicates). */}}
{{- define "gpuwatch.labelsWith" -}}
{{- toYaml (mergeOverwrite (include "gpuwatch.labels" .root | fromYaml) (.extra | default dict)) }}
{{- end -}}

{{/* The service account the agent runs as: "namespace:name". */}}
{{- define "gpuwatch.serviceAccount" -}}
{{- if eq .Values.mode "dcgmSidecar" -}}
{{ .Values.dcgmSidecar.serviceAccountName }}
{{- else -}}
{{ .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{/* The agent image reference. */}}
{{- define "gpuwatch.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- if .Values.image.tag -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- end -}}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* Namespace of a monitoring object: its own value, or the release's. */}}
{{- define "gpuwatch.monitoringNamespace" -}}
{{ .namespace | default .root.Release.Namespace }}
{{- end -}}
