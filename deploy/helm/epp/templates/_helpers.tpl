{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "epp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource base name: fullnameOverride, else <release>-epp (or the release name when it
already contains the chart name). */}}
{{- define "epp.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "epp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "epp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "epp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "epp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end }}

{{- define "epp.envoySelectorLabels" -}}
app.kubernetes.io/name: {{ include "epp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: envoy
{{- end }}

{{/* Non-empty when epp checks callers of its metrics port (--metrics-endpoint-auth). */}}
{{- define "epp.metricsAuth" -}}
{{- if .Values.monitoring.metricsAuth }}true{{ end }}
{{- end }}

{{/* The Secret holding the metrics reader's token. */}}
{{- define "epp.readerSecretName" -}}
{{- default (printf "%s-metrics-reader" (include "epp.fullname" .)) .Values.monitoring.readerSecretName }}
{{- end }}

{{/* The image reference: [registry/]repository:tag. */}}
{{- define "epp.image" -}}
{{- if .Values.image.registry }}{{ .Values.image.registry }}/{{ end }}{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* Non-empty in pool-less mode (pool.endpointSelector). */}}
{{- define "epp.poolless" -}}
{{- if .Values.pool.endpointSelector }}true{{ end }}
{{- end }}

{{/* Non-empty when the chart's Envoy runs inside epp's pod. */}}
{{- define "epp.envoySidecar" -}}
{{- if and .Values.envoy.enabled (eq .Values.envoy.mode "sidecar") }}true{{ end }}
{{- end }}

{{- define "epp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "epp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The InferencePool epp serves. */}}
{{- define "epp.poolName" -}}
{{- default .Release.Name .Values.pool.name }}
{{- end }}

{{- define "epp.poolNamespace" -}}
{{- default .Release.Namespace .Values.pool.namespace }}
{{- end }}

{{/* The EndpointPickerConfig: the user's, else the default epp ships for the KV-events mode. */}}
{{- define "epp.schedulingConfig" -}}
{{- if .Values.schedulingConfig }}
{{- .Values.schedulingConfig }}
{{- else if eq .Values.epp.kvEvents.mode "off" }}
{{- .Files.Get "files/default-config.yaml" }}
{{- else }}
{{- .Files.Get "files/default-precise-config.yaml" }}
{{- end }}
{{- end }}

{{/* epp's in-cluster gRPC address (ext-proc). */}}
{{- define "epp.serviceHost" -}}
{{- printf "%s.%s.svc.%s" (include "epp.fullname" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* The ext-proc address the chart's Envoy resolves: in sidecar mode its own pod's epp; with
several replicas the headless Service, whose DNS lists every ready replica (STRICT_DNS then
spreads streams over them all). */}}
{{- define "epp.extProcHost" -}}
{{- if include "epp.envoySidecar" . }}
{{- "127.0.0.1" }}
{{- else if gt (int .Values.replicas) 1 }}
{{- printf "%s-replicas.%s.svc.%s" (include "epp.fullname" .) .Release.Namespace .Values.clusterDomain }}
{{- else }}
{{- include "epp.serviceHost" . }}
{{- end }}
{{- end }}

{{/* Which tokenizer volume is set: pvc, hostPath, configMap or "". */}}
{{- define "epp.tokenizerSource" -}}
{{- $t := .Values.tokenizer }}
{{- $n := 0 }}
{{- if $t.pvc.claimName }}{{ $n = add1 $n }}{{ end }}
{{- if $t.hostPath.path }}{{ $n = add1 $n }}{{ end }}
{{- if $t.configMap.name }}{{ $n = add1 $n }}{{ end }}
{{- if gt $n 1 }}{{ fail "tokenizer: set only one of pvc.claimName, hostPath.path, configMap.name" }}{{ end }}
{{- if $t.pvc.claimName }}pvc{{ else if $t.hostPath.path }}hostPath{{ else if $t.configMap.name }}configMap{{ end }}
{{- end }}

{{/* GKE's preferred backends (gke.preferredBackends), one entry per epp pod, by ordinal: its
Service (the first pod's is epp's own), its policies' name and its backend tier, named as llm-d's
chart names them. A YAML list: `include "epp.preferredBackends" . | fromYamlArray`. */}}
{{- define "epp.preferredBackends" -}}
{{- $pb := .Values.gke.preferredBackends -}}
{{- $full := include "epp.fullname" . -}}
{{- $pool := include "epp.poolName" . -}}
{{- $preferred := int $pb.preferredReplicas -}}
{{- range $i := until (int .Values.replicas) }}
{{- $suffix := printf "-preferred-%d" $i -}}
{{- if eq $i 0 }}{{ $suffix = "" }}{{ end -}}
{{- if eq $i $preferred }}{{ $suffix = "-backup" }}{{ end -}}
{{- if gt $i $preferred }}{{ $suffix = printf "-backup-%d" (sub $i $preferred) }}{{ end }}
- ordinal: {{ $i }}
  service: {{ printf "%s%s" $full $suffix }}
  policy: {{ printf "%s%s" $pool $suffix }}
  tier: {{ ternary "PREFERRED" "DEFAULT" (lt $i $preferred) }}
{{- end }}
{{- end -}}
