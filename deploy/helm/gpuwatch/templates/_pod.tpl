{{/*
The pod template's annotations: the device-injector requests for /dev/kmsg, the config
checksum, then podAnnotations (which win over a key of the same name). An unprivileged
container may not open a host device node, even one bind-mounted from a hostPath: the device
cgroup denies it. The requests ask the node's device injector (containerd NRI
device-injector, current and older prefixes; CRI-O) to allow /dev/kmsg (char 1:11) for the
gpuwatch container only; deploy/README.md "Kernel log access".
*/}}
{{- define "gpuwatch.podAnnotations" -}}
{{- $kmsg := "- path: /dev/kmsg\n  type: c\n  major: 1\n  minor: 11\n" -}}
{{- $annotations := dict
  "devices.noderesource.dev/container.gpuwatch" $kmsg
  "devices.nri.io/container.gpuwatch" $kmsg
  "io.kubernetes.cri-o.Devices" "/dev/kmsg:/dev/kmsg:r"
  "checksum/config" (include "gpuwatch.configText" . | sha256sum) -}}
{{- toYaml (mergeOverwrite $annotations (.Values.podAnnotations | default dict)) }}
{{- end -}}

{{/*
The pod template's labels: SELECTOR (a dict, which podLabels may not change) and BASE
(which they may), then podLabels.
*/}}
{{- define "gpuwatch.podLabels" -}}
{{- $podLabels := .root.Values.podLabels | default dict -}}
{{- range $k, $v := .selector -}}
{{- if and (hasKey $podLabels $k) (ne (toString (index $podLabels $k)) $v) -}}
{{ fail (printf "podLabels: %s is the DaemonSet's selector label (%s); it cannot be changed" $k $v) }}
{{- end -}}
{{- end -}}
{{- toYaml (mergeOverwrite (merge dict .selector .base) $podLabels) }}
{{- end -}}

{{/* gpuwatch's own tolerations: every fault taint key and the startup taint, any value and effect. */}}
{{- define "gpuwatch.ownTolerations" -}}
{{- $s := include "gpuwatch.settings" . | fromJson -}}
{{- range $s.faultTaintKeys }}
- key: {{ . }}
  operator: Exists
{{- end }}
- key: {{ $s.startupTaintKey }}
  operator: Exists
{{- end -}}

{{/* The container's own environment, before extraEnv. */}}
{{- define "gpuwatch.chartEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# Extra OTLP resource attributes. The agent's identity is service.name +
# service.instance.id (the node name); k8s.node.name and host.name come from NODE_NAME.
# Never the agent's own pod: k8s.pod.* on a resource names the pod a fault record is
# about (what the collector's k8sattributes associates by).
- name: OTEL_RESOURCE_ATTRIBUTES
  value: service.instance.id=$(NODE_NAME)
# NVML through the NVIDIA container toolkit: every GPU, management library only.
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: utility
{{- end -}}

{{/*
The container's environment: the chart's entries with extraEnv merged by name, so no name
appears twice (the API server refuses a server-side apply with duplicate env names, and a
client-side apply keeps only the last). An extraEnv entry replaces the chart's entry of its
name in place; OTEL_RESOURCE_ATTRIBUTES given as a value is appended to the chart's
attributes instead. Entries of other names follow, in their order. Two extraEnv entries of
one name fail the render.
*/}}
{{- define "gpuwatch.env" -}}
{{- $user := dict -}}
{{- range .Values.extraEnv -}}
{{- if hasKey $user .name -}}
{{- fail (printf "extraEnv: %s is given twice" .name) -}}
{{- end -}}
{{- $_ := set $user .name . -}}
{{- end -}}
{{- $env := list -}}
{{- $chartNames := dict -}}
{{- range $e := include "gpuwatch.chartEnv" . | fromYamlArray -}}
{{- $_ := set $chartNames $e.name true -}}
{{- $u := index $user $e.name -}}
{{- if not $u -}}
{{- $env = append $env $e -}}
{{- else if and (eq $e.name "OTEL_RESOURCE_ATTRIBUTES") (hasKey $u "value") (not (hasKey $u "valueFrom")) -}}
{{- $env = append $env (dict "name" $e.name "value" (trimSuffix "," (printf "%s,%s" $e.value (trimPrefix "," $u.value)))) -}}
{{- else -}}
{{- $env = append $env $u -}}
{{- end -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- if not (hasKey $chartNames .name) -}}
{{- $env = append $env . -}}
{{- end -}}
{{- end -}}
{{- toYaml $env }}
{{- end -}}

{{/* The gpuwatch container. */}}
{{- define "gpuwatch.container" -}}
{{- $s := include "gpuwatch.settings" . | fromJson -}}
- name: gpuwatch
  image: {{ include "gpuwatch.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["/usr/local/bin/gpuwatch"]
  args:
    - run
    - --config
    - /etc/gpuwatch/gpuwatch.toml
    {{- if eq .Values.mode "dcgmSidecar" }}
    # The API port as a flag (flags override the config file): dcgm-exporter owns 9400.
    - --api-listen=0.0.0.0:{{ $s.apiPort | int }}
    {{- end }}
    {{- with .Values.otlp.endpoint }}
    # Wins over [otlp] endpoint in the config file and OTEL_EXPORTER_OTLP_ENDPOINT; the agent
    # logs which source gave each signal's endpoint.
    - --otlp-endpoint={{ . }}
    {{- end }}
    {{- range .Values.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    {{- include "gpuwatch.env" . | nindent 4 }}
  ports:
    - name: api
      containerPort: {{ $s.apiPort | int }}
      protocol: TCP
  startupProbe:
    {{- toYaml (merge (dict "httpGet" (dict "path" "/healthz" "port" "api")) .Values.probes.startup) | nindent 4 }}
  livenessProbe:
    {{- toYaml (merge (dict "httpGet" (dict "path" "/healthz" "port" "api")) .Values.probes.liveness) | nindent 4 }}
  readinessProbe:
    {{- toYaml (merge (dict "httpGet" (dict "path" "/readyz" "port" "api")) .Values.probes.readiness) | nindent 4 }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  # Root with every capability but CAP_SYSLOG dropped: reading /dev/kmsg needs CAP_SYSLOG in
  # the effective set, which Kubernetes gives only to UID 0 (deploy/README.md "Privileges").
  securityContext:
    runAsUser: 0
    runAsGroup: 0
    runAsNonRoot: false
    privileged: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
      add: ["SYSLOG"]
    seccompProfile:
      type: RuntimeDefault
  volumeMounts:
    - name: kmsg
      mountPath: /dev/kmsg
      readOnly: true
    - name: state
      mountPath: {{ $s.stateDir }}
    - name: host-proc
      mountPath: /host/proc
      readOnly: true
    - name: pod-resources
      mountPath: /var/lib/kubelet/pod-resources
      readOnly: true
    - name: host-sys
      mountPath: /host/sys
      readOnly: true
    - name: config
      mountPath: /etc/gpuwatch
      readOnly: true
    - name: tmp
      mountPath: /tmp
    {{- if eq .Values.mode "dcgmSidecar" }}
    - name: gpuwatch-api-access
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* The pod's volumes. */}}
{{- define "gpuwatch.volumes" -}}
{{- $s := include "gpuwatch.settings" . | fromJson -}}
- name: kmsg
  hostPath:
    path: /dev/kmsg
    type: CharDevice
# The only writable host path: kernel-log position, fault history, condition flap history.
- name: state
  hostPath:
    path: {{ $s.stateDir }}
    type: DirectoryOrCreate
# The host's /proc, read-only: a faulting pid is attributed to its pod (not hostPID).
- name: host-proc
  hostPath:
    path: /proc
    type: Directory
# The kubelet's PodResources socket: which pods hold which GPUs.
- name: pod-resources
  hostPath:
    path: /var/lib/kubelet/pod-resources
# The host's whole /sys, read-only, one tree ([network] sysfs_root = "/host/sys"): the RDMA
# NICs' ports and counters, the RoCE netdevs (the container's own /sys, mounted in the pod's
# network namespace, hides the host's netdevs).
- name: host-sys
  hostPath:
    path: /sys
    type: Directory
- name: config
  configMap:
    name: {{ include "gpuwatch.configMapName" . }}
- name: tmp
  emptyDir:
    medium: Memory
    sizeLimit: 8Mi
{{- if eq .Values.mode "dcgmSidecar" }}
# The operator's DaemonSet sets automountServiceAccountToken: false: gpuwatch's container
# mounts the token the kubelet would (pod-bound, naming the node, as the admission policies
# require), the cluster CA and the namespace, for itself only.
- name: gpuwatch-api-access
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: {{ .Values.dcgmSidecar.tokenExpirationSeconds | int }}
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                apiVersion: v1
                fieldPath: metadata.namespace
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}
