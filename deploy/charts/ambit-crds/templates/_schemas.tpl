{{- /*
The `spec` schema of each kind: the fields Ambit reads, as Istio's own CRDs define them (types,
and the enumerations, which must equal the ones ambit-objects enforces on files: the chart test
compares them). Fields outside the schema are pruned by the API server (and refused by
`kubectl apply`'s field validation), as Ambit's file reader refuses them.
*/ -}}
{{- define "ambit-crds.strings" -}}
type: array
items:
  type: string
{{- end }}

{{- define "ambit-crds.labels" -}}
type: object
additionalProperties:
  type: string
{{- end }}

{{- define "ambit-crds.targetRef" -}}
type: object
properties:
  group:
    type: string
  kind:
    type: string
  name:
    type: string
  namespace:
    type: string
{{- end }}

{{- define "ambit-crds.selector" -}}
type: object
properties:
  matchLabels:
    {{- include "ambit-crds.labels" . | nindent 4 }}
{{- end }}

{{- define "ambit-crds.mtls" -}}
type: object
properties:
  mode:
    type: string
    enum: [UNSET, DISABLE, PERMISSIVE, STRICT]
{{- end }}

{{- define "ambit-crds.workloadEntry" -}}
type: object
properties:
  address:
    type: string
  ports:
    type: object
    additionalProperties:
      type: integer
  labels:
    {{- include "ambit-crds.labels" . | nindent 4 }}
  network:
    type: string
  locality:
    type: string
  weight:
    type: integer
  serviceAccount:
    type: string
{{- end }}

{{- define "ambit-crds.spec.AuthorizationPolicy" -}}
type: object
properties:
  selector:
    {{- include "ambit-crds.selector" . | nindent 4 }}
  targetRef:
    {{- include "ambit-crds.targetRef" . | nindent 4 }}
  targetRefs:
    type: array
    items:
      {{- include "ambit-crds.targetRef" . | nindent 6 }}
  action:
    type: string
    enum: [ALLOW, DENY, AUDIT, CUSTOM]
  provider:
    type: object
    properties:
      name:
        type: string
  rules:
    type: array
    items:
      type: object
      properties:
        from:
          type: array
          items:
            type: object
            properties:
              source:
                type: object
                properties:
                  {{- range list "principals" "notPrincipals" "requestPrincipals" "notRequestPrincipals" "namespaces" "notNamespaces" "serviceAccounts" "notServiceAccounts" "ipBlocks" "notIpBlocks" "remoteIpBlocks" "notRemoteIpBlocks" }}
                  {{ . }}:
                    {{- include "ambit-crds.strings" $ | nindent 20 }}
                  {{- end }}
        to:
          type: array
          items:
            type: object
            properties:
              operation:
                type: object
                properties:
                  {{- range list "hosts" "notHosts" "ports" "notPorts" "methods" "notMethods" "paths" "notPaths" }}
                  {{ . }}:
                    {{- include "ambit-crds.strings" $ | nindent 20 }}
                  {{- end }}
        when:
          type: array
          items:
            type: object
            properties:
              key:
                type: string
              values:
                {{- include "ambit-crds.strings" . | nindent 16 }}
              notValues:
                {{- include "ambit-crds.strings" . | nindent 16 }}
{{- end }}

{{- define "ambit-crds.spec.PeerAuthentication" -}}
type: object
properties:
  selector:
    {{- include "ambit-crds.selector" . | nindent 4 }}
  mtls:
    {{- include "ambit-crds.mtls" . | nindent 4 }}
  portLevelMtls:
    type: object
    additionalProperties:
      {{- include "ambit-crds.mtls" . | nindent 6 }}
{{- end }}

{{- define "ambit-crds.spec.ServiceEntry" -}}
type: object
properties:
  hosts:
    {{- include "ambit-crds.strings" . | nindent 4 }}
  addresses:
    {{- include "ambit-crds.strings" . | nindent 4 }}
  ports:
    type: array
    items:
      type: object
      properties:
        number:
          type: integer
        protocol:
          type: string
        name:
          type: string
        targetPort:
          type: integer
  location:
    type: string
    enum: [MESH_EXTERNAL, MESH_INTERNAL]
  resolution:
    type: string
    enum: [NONE, STATIC, DNS, DNS_ROUND_ROBIN, DYNAMIC_DNS]
  endpoints:
    type: array
    items:
      {{- include "ambit-crds.workloadEntry" . | nindent 6 }}
  workloadSelector:
    type: object
    properties:
      labels:
        {{- include "ambit-crds.labels" . | nindent 8 }}
  exportTo:
    {{- include "ambit-crds.strings" . | nindent 4 }}
  subjectAltNames:
    {{- include "ambit-crds.strings" . | nindent 4 }}
{{- end }}

{{- define "ambit-crds.spec.WorkloadEntry" -}}
{{- include "ambit-crds.workloadEntry" . }}
{{- end }}
