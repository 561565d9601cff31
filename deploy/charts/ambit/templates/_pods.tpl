{{/*
What the chart itself puts into each component's pods: labels, annotations, environment,
volumes and mounts. Defined once here so that the workload templates render them and
`ambit.validateExtras` refuses user additions that would change them. Each define takes the
root context, except the labels and annotations, which take (dict "root" $ "component" c).
*/}}

{{- define "ambit.podLabels" -}}
{{- $app := get (dict "agent" "ambit-agent" "proxy" "ztunnel" "control" "ambit-control") .component -}}
{{- include "ambit.selector" (dict "root" .root "app" $app) }}
app.kubernetes.io/name: ambit
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
# Never enrolled, never injected.
istio.io/dataplane-mode: none
sidecar.istio.io/inject: "false"
{{- end -}}

{{- define "ambit.podAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ get (dict "agent" "15014" "proxy" "15020" "control" "15014") .component | quote }}
prometheus.io/path: /metrics
{{- if eq .component "control" }}
# A new CA (ca.existingSecret changed) restarts the replicas.
checksum/ca: {{ printf "%s/%s" .root.Values.ca.existingSecret .root.Values.ca.rootCert | sha256sum | trunc 16 }}
{{- end }}
{{- end -}}

{{/*
A pod template's metadata: the chart's labels and annotations with the component's podLabels
and podAnnotations added (validated not to differ). Call with (dict "root" $ "component" c).
*/}}
{{- define "ambit.podMetadata" -}}
{{- $v := index .root.Values .component -}}
labels:
  {{- merge (dict) (include "ambit.podLabels" . | fromYaml) $v.podLabels | toYaml | nindent 2 }}
annotations:
  {{- merge (dict) (include "ambit.podAnnotations" . | fromYaml) $v.podAnnotations | toYaml | nindent 2 }}
{{- end -}}

{{/*
A list the chart defines (`ambit.<component>.<what>`) followed by the component's own entries:
env (a map, rendered name by name in key order), volumes, volumeMounts. Call with
(dict "root" $ "component" c "what" "env").
*/}}
{{- define "ambit.extended" -}}
{{- include (printf "ambit.%s.%s" .component .what) .root }}
{{- $extra := index (index .root.Values .component) .what -}}
{{- if eq .what "env" }}
{{- $chart := include (printf "ambit.%s.env" .component) .root | fromYamlArray -}}
{{- range $k, $val := $extra }}
{{- $dup := false -}}
{{- range $chart }}{{ if eq .name $k }}{{ $dup = true }}{{ end }}{{ end -}}
{{- if not $dup }}
- name: {{ $k }}
  value: {{ toString $val | quote }}
{{- end }}
{{- end }}
{{- else if $extra }}
{{ toYaml $extra }}
{{- end }}
{{- end -}}

{{/* ---- agent ---- */}}

{{- define "ambit.agent.env" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
# With the pod's name and namespace the agent names its own pods in the plugin
# config, so a replacement agent pod always starts, even while no agent runs.
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# The agent's own DaemonSet: when it stops while this DaemonSet is being deleted (an
# uninstall), it takes ambit-cni out of the node's CNI chain; otherwise it leaves it.
- name: AMBIT_AGENT_DAEMONSET
  value: {{ include "ambit.name" (dict "root" . "base" "ambit-agent") | quote }}
# The node proxy's pods (templates/proxy.yaml), never enrolled and always started.
- name: AMBIT_PROXY_POD_LABELS
  value: app=ztunnel
- name: MOUNTED_CNI_NET_DIR
  value: /host/etc/cni/net.d
- name: AMBIT_CNI_BIN_DIR
  value: /host/opt/cni/bin
# Where the image keeps the plugin (deploy/images/Dockerfile).
- name: AMBIT_CNI_BINARY
  value: /opt/cni/bin/ambit-cni
# CNI_NETNS paths name the host's filesystem.
- name: AMBIT_HOST_PREFIX
  value: /host
- name: AMBIT_PROC_ROOT
  value: /host/proc
- name: AMBIT_HOST_NETNS
  value: /host/proc/1/ns/net
# The plugin, running on the host, reaches the agent's socket at this path: the
# same on the host and in the container.
- name: CNI_AGENT_RUN_DIR
  value: /var/run/ambit
- name: ZTUNNEL_UDS_ADDRESS
  value: /var/run/ztunnel/ztunnel.sock
- name: AMBIT_CAPTURE_BACKEND
  value: {{ .Values.agent.captureBackend | quote }}
- name: EXCLUDE_NAMESPACES
  value: {{ join "," .Values.agent.excludedNamespaces | quote }}
- name: AMBIT_UNINSTALL_ON_EXIT
  value: {{ .Values.agent.uninstallOnExit | toString | quote }}
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
{{- end -}}

{{- define "ambit.agent.volumeMounts" -}}
- name: cni-bin-dir
  mountPath: /host/opt/cni/bin
- name: cni-conf-dir
  mountPath: /host/etc/cni/net.d
- name: host-proc
  mountPath: /host/proc
  readOnly: true
# Network namespaces the runtime creates after the agent started must appear.
- name: netns-dir
  mountPath: /host{{ .Values.platform.netnsDir }}
  mountPropagation: HostToContainer
- name: run-dir
  mountPath: /var/run/ambit
- name: ztunnel-sock-dir
  mountPath: /var/run/ztunnel
# iptables-legacy takes a lock file; the image points XTABLES_LOCKFILE here.
- name: xtables-lock
  mountPath: /run/xtables
{{- end -}}

{{- define "ambit.agent.volumes" -}}
- name: cni-bin-dir
  hostPath:
    path: {{ .Values.platform.cniBinDir }}
    type: DirectoryOrCreate
- name: cni-conf-dir
  hostPath:
    path: {{ .Values.platform.cniConfDir }}
    type: DirectoryOrCreate
- name: host-proc
  hostPath:
    path: /proc
    type: Directory
- name: netns-dir
  hostPath:
    path: {{ .Values.platform.netnsDir }}
    type: DirectoryOrCreate
- name: run-dir
  hostPath:
    path: /var/run/ambit
    type: DirectoryOrCreate
- name: ztunnel-sock-dir
  hostPath:
    path: /var/run/ztunnel
    type: DirectoryOrCreate
- name: xtables-lock
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end -}}

{{/* ---- proxy ---- */}}

{{- define "ambit.proxy.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: INSTANCE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: SERVICE_ACCOUNT
  valueFrom:
    fieldRef:
      fieldPath: spec.serviceAccountName
- name: XDS_ADDRESS
  value: {{ include "ambit.discoveryAddress" . | quote }}
- name: CA_ADDRESS
  value: {{ include "ambit.discoveryAddress" . | quote }}
- name: XDS_ROOT_CA
  value: /var/run/secrets/istio/root-cert.pem
- name: CA_ROOT_CA
  value: /var/run/secrets/istio/root-cert.pem
- name: AUTH_TOKEN
  value: /var/run/secrets/tokens/istio-token
- name: TERMINATION_GRACE_PERIOD_SECONDS
  value: {{ .Values.proxy.terminationGracePeriodSeconds | toString | quote }}
{{- if not (kindIs "invalid" .Values.proxy.drainDeadlineSeconds) }}
- name: CONNECTION_TERMINATION_DEADLINE
  value: {{ printf "%ds" (int .Values.proxy.drainDeadlineSeconds) | quote }}
{{- end }}
# Worker threads follow the CPU limit (the node's cores when there is none).
- name: ZTUNNEL_CPU_LIMIT
  valueFrom:
    resourceFieldRef:
      resource: limits.cpu
      divisor: "1"
- name: INPOD_UDS
  value: /var/run/ztunnel/ztunnel.sock
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
{{- if include "ambit.logAsJson" (dict "root" . "component" "proxy") }}
- name: LOG_FORMAT
  value: json
{{- end }}
{{- end -}}

{{- define "ambit.proxy.volumeMounts" -}}
- name: istio-token
  mountPath: /var/run/secrets/tokens
  readOnly: true
- name: istiod-ca-cert
  mountPath: /var/run/secrets/istio
  readOnly: true
- name: ztunnel-sock-dir
  mountPath: /var/run/ztunnel
{{- end -}}

{{- define "ambit.proxy.volumes" -}}
# A pod-bound token for the control plane's CA and xDS (audience istio-ca); the
# kubelet renews it, the proxy re-reads it per request.
- name: istio-token
  projected:
    sources:
      - serviceAccountToken:
          audience: istio-ca
          expirationSeconds: 43200
          path: istio-token
# The mesh root: the chart's (templates/ca.yaml) or istiod's.
- name: istiod-ca-cert
  configMap:
    name: {{ include "ambit.rootConfigMap" . }}
- name: ztunnel-sock-dir
  hostPath:
    path: /var/run/ztunnel
    type: DirectoryOrCreate
{{- end -}}

{{/* ---- control ---- */}}

{{- define "ambit.control.env" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# The name the proxies dial goes into the serving certificate beside istiod's.
- name: ISTIOD_CUSTOM_HOST
  value: {{ include "ambit.controlAddress" . | trimSuffix ":15012" | quote }}
# The node proxies' account (templates/serviceaccounts.yaml) may request
# certificates for the pods on its node.
- name: CA_TRUSTED_NODE_ACCOUNTS
  value: {{ printf "%s/%s" .Release.Namespace (include "ambit.name" (dict "root" . "base" "ztunnel")) | quote }}
- name: ROOT_CA_DIR
  value: /etc/cacerts
- name: AMBIT_CONTROL_STATE_DIR
  value: /var/lib/ambit/control
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
{{- if include "ambit.logAsJson" (dict "root" . "component" "control") }}
- name: AMBIT_LOG_FORMAT
  value: json
{{- end }}
{{- with .Values.revision }}
# Istio objects labelled istio.io/rev with another revision are left to that revision.
- name: REVISION
  value: {{ . | quote }}
{{- end }}
# What a waypoint Gateway (class istio-waypoint) gets deployed with: the proxy's
# image (it holds `ambit waypoint`) and the address it dials for xDS and the CA.
- name: AMBIT_WAYPOINT_IMAGE
  value: {{ include "ambit.image" (dict "root" . "repository" .Values.proxy.image.repository) | quote }}
- name: AMBIT_WAYPOINT_CONTROL_ADDRESS
  value: {{ include "ambit.controlAddress" . | quote }}
{{- end -}}

{{- define "ambit.control.volumeMounts" -}}
- name: cacerts
  mountPath: /etc/cacerts
  readOnly: true
# Only the self-signed fallback root would go here; with `cacerts` mounted the
# control plane keeps nothing, so an emptyDir is enough.
- name: state
  mountPath: /var/lib/ambit/control
{{- end -}}

{{- define "ambit.control.volumes" -}}
- name: cacerts
  secret:
    secretName: {{ .Values.ca.existingSecret | default "cacerts" }}
    # 0440 (written in decimal: YAML 1.1 and 1.2 read a leading 0 differently)
    defaultMode: 288
- name: state
  emptyDir:
    sizeLimit: 16Mi
{{- end -}}
