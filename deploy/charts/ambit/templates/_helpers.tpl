{{/*
Shared pieces of the ambit chart. Names are fixed rather than derived from the release name:
other components find these objects by name (the control plane trusts `<namespace>/ztunnel`,
the agent recognises the proxy's pods by `app=ztunnel`, proxies read the ConfigMap
`istio-ca-root-cert`), so one release per namespace.
*/}}

{{/* Labels every object of the release carries. */}}
{{- define "ambit.labels" -}}
app.kubernetes.io/name: ambit
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
Validates the values (templates/validate.yaml runs it), so a bad combination fails the whole
render with one message. values.schema.json catches wrong types and enum values first; the
enum checks are repeated here for `--skip-schema-validation`.
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
{{- if and (eq .Values.mode "istiod") (not .Values.istiod.address) -}}
{{- fail "mode=istiod needs istiod.address (e.g. istiod.istio-system.svc:15012)" -}}
{{- end -}}
{{- if and .Values.ca.existingSecret (not .Values.ca.rootCert) (eq .Values.mode "ambit") -}}
{{- fail (printf "ca.existingSecret=%s needs ca.rootCert: the Secret's root-cert.pem, which the proxies trust (the chart does not read Secrets)" .Values.ca.existingSecret) -}}
{{- end -}}
{{- if eq (toString .Values.image.tag) "latest" -}}
{{- fail "image.tag=latest is refused: a floating tag does not name the binaries this chart was written for; leave it empty for the chart's appVersion, or pin a version or image.digest" -}}
{{- end -}}
{{- if and .Values.image.digest (not (regexMatch "^sha256:[0-9a-f]{64}$" .Values.image.digest)) -}}
{{- fail (printf "image.digest must look like sha256:<64 hex digits>, not %q" .Values.image.digest) -}}
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

{{/*
An image reference: registry/repository, then @digest if set, else :tag (default: the chart's
appVersion, so a chart version always runs the binaries it was written for).
Call with (dict "root" $ "repository" "ambit").
*/}}
{{- define "ambit.image" -}}
{{- $v := .root.Values.image -}}
{{- $name := .repository -}}
{{- if $v.registry -}}{{- $name = printf "%s/%s" (trimSuffix "/" $v.registry) .repository -}}{{- end -}}
{{- if $v.digest -}}
{{- printf "%s@%s" $name $v.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (toString ($v.tag | default .root.Chart.AppVersion)) -}}
{{- end -}}
{{- end -}}

{{/* The control plane's Service address, as the proxies dial it. */}}
{{- define "ambit.controlAddress" -}}
{{- printf "ambit-control.%s.svc:15012" .Release.Namespace -}}
{{- end -}}

{{/* Where the proxies find xDS and the CA. */}}
{{- define "ambit.discoveryAddress" -}}
{{- if eq .Values.mode "istiod" -}}{{ .Values.istiod.address }}{{- else -}}{{ include "ambit.controlAddress" . }}{{- end -}}
{{- end -}}
