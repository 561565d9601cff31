{{/*
Shared pieces of the ambit chart. Names are fixed rather than derived from the release name:
other components find these objects by name (the control plane trusts `<namespace>/ztunnel`,
the agent recognises the proxy's pods by `app=ztunnel`, proxies read the ConfigMap
`istio-ca-root-cert`), so one release per namespace, unless each has its own `revision`, which
suffixes every name (and the names that point at them) with `-<revision>`.
*/}}

{{/* An object's name: `base`, or `base-<revision>`. Call with (dict "root" $ "base" "ztunnel"). */}}
{{- define "ambit.name" -}}
{{- if .root.Values.revision -}}{{ printf "%s-%s" .base .root.Values.revision }}{{- else -}}{{ .base }}{{- end -}}
{{- end -}}

{{/* Labels every object of the release carries. */}}
{{- define "ambit.labels" -}}
app.kubernetes.io/name: ambit
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.revision }}
istio.io/rev: {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
The labels a component's pods are selected by: `app: <app>`, and with a revision
`istio.io/rev: <revision>`, so two revisions' workloads in one namespace never select each
other's pods. Call with (dict "root" $ "app" "ztunnel").
*/}}
{{- define "ambit.selector" -}}
app: {{ .app }}
{{- with .root.Values.revision }}
istio.io/rev: {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
Validates the values (templates/validate.yaml runs it), so a bad combination fails the whole
render with one message. values.schema.json catches wrong types, unknown keys and enum values
first; the enum checks are repeated here for `--skip-schema-validation`.
*/}}
{{- define "ambit.validate" -}}
{{- if not (has .Values.mode (list "ambit" "istiod")) -}}
{{- fail (printf "mode must be \"ambit\" or \"istiod\", not %q" (toString .Values.mode)) -}}
{{- end -}}
{{- if not (has .Values.agent.captureBackend (list "nftables" "iptables")) -}}
{{- fail (printf "agent.captureBackend must be \"nftables\" or \"iptables\", not %q" (toString .Values.agent.captureBackend)) -}}
{{- end -}}
{{- $grace := int .Values.proxy.terminationGracePeriodSeconds -}}
{{- $deadline := include "ambit.proxyDrainSeconds" . | int -}}
{{- if le $grace $deadline -}}
{{- fail (printf "proxy.terminationGracePeriodSeconds (%d) must be longer than the proxy's drain deadline (%d s, proxy.drainDeadlineSeconds): the kubelet kills the proxy when the grace period ends, cutting connections that were still allowed to finish" $grace $deadline) -}}
{{- end -}}
{{- if and .Values.ca.existingSecret (not .Values.ca.rootCert) (eq .Values.mode "ambit") -}}
{{- fail (printf "ca.existingSecret=%s needs ca.rootCert: the Secret's root-cert.pem, which the proxies trust (the chart does not read Secrets)" .Values.ca.existingSecret) -}}
{{- end -}}
{{- /* A global value and the chart value it stands for: one of them, or the same. */ -}}
{{- $g := .Values.global -}}
{{- range $pair := list (list "image.registry" .Values.image.registry "global.hub" $g.hub) (list "image.tag" (toString .Values.image.tag) "global.tag" (toString $g.tag)) (list "image.pullPolicy" .Values.image.pullPolicy "global.imagePullPolicy" $g.imagePullPolicy) -}}
{{- $mine := index $pair 1 -}}{{- $theirs := index $pair 3 -}}
{{- if and $mine $theirs (ne $mine $theirs) -}}
{{- fail (printf "%s=%s and %s=%s disagree: they are the same setting (Istio's name and the chart's); set one of them" (index $pair 0) $mine (index $pair 2) $theirs) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.image.pullSecrets $g.imagePullSecrets -}}
{{- fail "image.pullSecrets and global.imagePullSecrets are the same setting (the chart's objects and Istio's names); set one of them" -}}
{{- end -}}
{{- if eq (include "ambit.tag" .) "latest" -}}
{{- fail (printf "%s=latest is refused: a floating tag does not name the binaries this chart was written for; leave it empty for the chart's appVersion, or pin a version or image.digest" (ternary "image.tag" "global.tag" (eq (toString .Values.image.tag) "latest"))) -}}
{{- end -}}
{{- if and .Values.image.digest (not (regexMatch "^sha256:[0-9a-f]{64}$" .Values.image.digest)) -}}
{{- fail (printf "image.digest must look like sha256:<64 hex digits>, not %q" .Values.image.digest) -}}
{{- end -}}
{{- /* The agent hands a node's pods to that node's proxy: both run on the same nodes. */ -}}
{{- range $key := list "nodeSelector" "affinity" "tolerations" -}}
{{- if ne (toJson (index $.Values.agent $key)) (toJson (index $.Values.proxy $key)) -}}
{{- fail (printf "agent.%s and proxy.%s differ: the agent and the proxy must run on the same nodes (a node with an agent and no proxy leaves its captured pods without connectivity); set the same value on both" $key $key) -}}
{{- end -}}
{{- end -}}
{{- range $c := list "agent" "proxy" "control" -}}
{{- include "ambit.validateExtras" (dict "root" $ "component" $c) -}}
{{- end -}}
{{- end -}}

{{/*
A component's additions (podLabels, podAnnotations, env, volumes, volumeMounts) never change
what the chart sets itself: a key the chart sets is refused unless given the same value, and a
volume name or mount path the chart uses is refused.
*/}}
{{- define "ambit.validateExtras" -}}
{{- $c := .component -}}
{{- $v := index .root.Values $c -}}
{{- $args := dict "root" .root "component" $c -}}
{{- range $what, $chart := dict "podLabels" (include "ambit.podLabels" $args | fromYaml) "podAnnotations" (include "ambit.podAnnotations" $args | fromYaml) -}}
{{- range $k, $val := index $v $what -}}
{{- if and (hasKey $chart $k) (ne (toString (index $chart $k)) (toString $val)) -}}
{{- fail (printf "%s.%s.%s=%s is refused: the chart sets %s to %q on the %s's pods itself" $c $what $k (toString $val) $k (toString (index $chart $k)) (include "ambit.componentName" $c)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $env := include (printf "ambit.%s.env" $c) .root | fromYamlArray -}}
{{- range $k, $val := $v.env -}}
{{- range $e := $env -}}
{{- if and (eq $e.name $k) (or (not (hasKey $e "value")) (ne (toString $e.value) (toString $val))) -}}
{{- fail (printf "%s.env.%s is refused: the chart sets %s on the %s itself (%s); change the chart value that sets it instead" $c $k $k (include "ambit.componentName" $c) (include "ambit.envSource" $e)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $volumes := include (printf "ambit.%s.volumes" $c) .root | fromYamlArray -}}
{{- range $x := $v.volumes -}}
{{- range $y := $volumes -}}
{{- if eq $x.name $y.name -}}
{{- fail (printf "%s.volumes: the name %s is refused: the chart's own volume has it" $c $x.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $mounts := include (printf "ambit.%s.volumeMounts" $c) .root | fromYamlArray -}}
{{- range $x := $v.volumeMounts -}}
{{- range $y := $mounts -}}
{{- if eq (trimSuffix "/" $x.mountPath) (trimSuffix "/" $y.mountPath) -}}
{{- fail (printf "%s.volumeMounts: the path %s is refused: the chart mounts its volume %s there" $c $x.mountPath $y.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's name in messages. */}}
{{- define "ambit.componentName" -}}
{{- get (dict "agent" "agent" "proxy" "proxy" "control" "control plane") . -}}
{{- end -}}

{{/* How the chart sets an environment variable, for messages: `"value"` or `from <field>`. */}}
{{- define "ambit.envSource" -}}
{{- if hasKey . "value" -}}
{{- printf "to %q" (toString .value) -}}
{{- else if .valueFrom.fieldRef -}}
{{- printf "from %s" .valueFrom.fieldRef.fieldPath -}}
{{- else if .valueFrom.resourceFieldRef -}}
{{- printf "from %s" .valueFrom.resourceFieldRef.resource -}}
{{- else -}}
from the pod
{{- end -}}
{{- end -}}

{{/*
The proxy's drain deadline in seconds: proxy.drainDeadlineSeconds if set, else what
`ambit proxy` derives from TERMINATION_GRACE_PERIOD_SECONDS (T-5 when T > 10, else T-1, at
least 1), so the check above holds for both.
*/}}
{{- define "ambit.proxyDrainSeconds" -}}
{{- if kindIs "invalid" .Values.proxy.drainDeadlineSeconds -}}
{{- $t := int .Values.proxy.terminationGracePeriodSeconds -}}
{{- if gt $t 10 -}}{{ sub $t 5 }}{{- else -}}{{ max (sub $t 1) 1 }}{{- end -}}
{{- else -}}
{{- int .Values.proxy.drainDeadlineSeconds -}}
{{- end -}}
{{- end -}}

{{/* The image registry: image.registry, else global.hub, else localhost/ambit. */}}
{{- define "ambit.registry" -}}
{{- .Values.image.registry | default .Values.global.hub | default "localhost/ambit" | trimSuffix "/" -}}
{{- end -}}

{{/* The image tag: image.tag, else global.tag, else the chart's appVersion. */}}
{{- define "ambit.tag" -}}
{{- toString (.Values.image.tag | default .Values.global.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
An image reference: registry/repository, then @digest if set, else :tag (default: the chart's
appVersion, so a chart version always runs the binaries it was written for).
Call with (dict "root" $ "repository" "ambit").
*/}}
{{- define "ambit.image" -}}
{{- $name := printf "%s/%s" (include "ambit.registry" .root) .repository -}}
{{- if .root.Values.image.digest -}}
{{- printf "%s@%s" $name .root.Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (include "ambit.tag" .root) -}}
{{- end -}}
{{- end -}}

{{/* A container's image and pull policy. Call with (dict "root" $ "component" "agent"). */}}
{{- define "ambit.containerImage" -}}
image: {{ include "ambit.image" (dict "root" .root "repository" (index .root.Values .component).image.repository) }}
imagePullPolicy: {{ .root.Values.image.pullPolicy | default .root.Values.global.imagePullPolicy | default "IfNotPresent" }}
{{- end -}}

{{/*
The pod-level settings every component takes the same way: priority class, node placement and
pull secrets. Call with (dict "root" $ "component" "agent").
*/}}
{{- define "ambit.podPlacement" -}}
{{- $v := index .root.Values .component -}}
{{- with $v.priorityClassName | default .root.Values.global.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml .root.Values.image.pullSecrets | nindent 2 }}
{{- else if .root.Values.global.imagePullSecrets }}
imagePullSecrets:
  {{- range .root.Values.global.imagePullSecrets }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* "true" when the component logs JSON: its own logAsJson, else global.logAsJson. */}}
{{- define "ambit.logAsJson" -}}
{{- $own := (index .root.Values .component).logAsJson -}}
{{- if kindIs "invalid" $own -}}{{ if .root.Values.global.logAsJson }}true{{ end }}{{- else if $own -}}true{{- end -}}
{{- end -}}

{{/* The control plane's Service address, as the proxies dial it. */}}
{{- define "ambit.controlAddress" -}}
{{- printf "%s.%s.svc:15012" (include "ambit.name" (dict "root" . "base" "ambit-control")) .Release.Namespace -}}
{{- end -}}

{{/* Where the proxies find xDS and the CA. */}}
{{- define "ambit.discoveryAddress" -}}
{{- if eq .Values.mode "istiod" -}}
{{- if .Values.istiod.address -}}
{{ .Values.istiod.address }}
{{- else -}}
{{ printf "%s.%s.svc:15012" (include "ambit.name" (dict "root" . "base" "istiod")) .Values.global.istioNamespace }}
{{- end -}}
{{- else -}}
{{ include "ambit.controlAddress" . }}
{{- end -}}
{{- end -}}

{{/* The ConfigMap holding the mesh root the proxies trust. */}}
{{- define "ambit.rootConfigMap" -}}
{{- if eq .Values.mode "istiod" -}}istio-ca-root-cert{{- else -}}{{ include "ambit.name" (dict "root" . "base" "istio-ca-root-cert") }}{{- end -}}
{{- end -}}
