{{/*
Values of llm-d Router's and GIE's charts, translated into epp's own (docs/migrate.md#helm-values).
Every template includes "epp.compat" first; it rewrites .Values once (a marker key makes it
idempotent, whichever template Helm renders first), so the rest of the chart reads only epp's
keys:

- llm-d Router v0.10's `llm-d-router-gateway` and `llm-d-router-standalone` charts: `router.*`
  (the EPP, its pool, proxy, monitoring, tracing, objectives), `provider.name` and the llm-d
  names under `httpRoute`;
- GIE v1.5's `inferencepool` chart: `inferenceExtension.*` (the same EPP keys as router.epp,
  with monitoring and tracing inside) and `inferencePool.{targetPorts: [{number}],
  modelServers.matchLabels, modelServerType}`.

With router.* or inferenceExtension.*, the defaults of those charts apply where they differ
from epp's: one replica (leader election from two), the pool created with failureMode
FailOpen, their default-plugins.yaml scoring (no KV events) and metrics authentication on. A
value that epp's chart cannot honour fails the install with what to use instead.
*/}}
{{- define "epp.compat" -}}
{{- if not (hasKey .Values "__translated") -}}
{{- $_ := set .Values "__translated" true -}}
{{- include "epp.compat.httpRoute" . -}}
{{- $r := .Values.router | default dict -}}
{{- $ie := .Values.inferenceExtension | default dict -}}
{{- if and $r $ie -}}
{{- fail "give llm-d's router.* or GIE's inferenceExtension.*, not both" -}}
{{- end -}}
{{- if $r -}}
{{- include "epp.compat.router" . -}}
{{- end -}}
{{- if $ie -}}
{{- include "epp.compat.gie" . -}}
{{- end -}}
{{- include "epp.compat.provider" . -}}
{{- include "epp.compat.pool" . -}}
{{- $pb := .Values.gke.preferredBackends | default dict -}}
{{- if $pb.enabled -}}
{{- if not .Values.gke.enabled -}}
{{- fail "gke.preferredBackends.enabled needs gke.enabled (GKE's Gateway reads the policies)" -}}
{{- end -}}
{{- /* One pod per Service, PREFERRED then DEFAULT: the pod count is theirs. */ -}}
{{- $_ := set .Values "replicas" (add (int $pb.preferredReplicas) (int $pb.defaultReplicas)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* inferencePool: GIE's targetPorts [{number}] and modelServers.matchLabels; epp's own forms. */}}
{{- define "epp.compat.pool" -}}
{{- $p := .Values.inferencePool -}}
{{- $ports := list -}}
{{- range $p.targetPorts -}}
{{- if kindIs "map" . -}}
{{- $ports = append $ports (int .number) -}}
{{- else -}}
{{- $ports = append $ports (int .) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $p "targetPorts" $ports -}}
{{- $labels := (($p.modelServers | default dict).matchLabels) | default dict -}}
{{- if $labels -}}
{{- if and $p.selector (ne (toJson $p.selector) (toJson $labels)) -}}
{{- fail "inferencePool.selector and inferencePool.modelServers.matchLabels differ: give one" -}}
{{- end -}}
{{- $_ := set $p "selector" $labels -}}
{{- end -}}
{{- if and $p.modelServerType (ne $p.modelServerType "vllm") -}}
{{- fail (printf "inferencePool.modelServerType=%s: with epp's own values the engine is chosen in the scheduling config (core-metrics-extractor's defaultEngine; docs/configs.md)" $p.modelServerType) -}}
{{- end -}}
{{- if and $p.modelServerProtocol (ne $p.modelServerProtocol "http") -}}
{{- fail (printf "inferencePool.modelServerProtocol=%s: epp routes HTTP model servers only (the vllmgrpc-parser is not built)" $p.modelServerProtocol) -}}
{{- end -}}
{{- if $p.parser -}}
{{- fail (printf "inferencePool.parser=%s: with epp's own values put requestHandler.parsers in the scheduling config" $p.parser) -}}
{{- end -}}
{{- if and $p.apiVersion (ne $p.apiVersion "inference.networking.k8s.io/v1") -}}
{{- fail (printf "inferencePool.apiVersion=%s: epp serves InferencePool inference.networking.k8s.io/v1 only" $p.apiVersion) -}}
{{- end -}}
{{- if and .Values.pool.endpointSelector $p.create -}}
{{- fail "pool.endpointSelector (pool-less mode) and inferencePool.create exclude each other" -}}
{{- end -}}
{{- end -}}

{{/* httpRoute: llm-d's create / inferenceGatewayName / inferenceGatewayNamespace; GIE's
experimentalHttpRoute (enabled, inferenceGatewayName, requestTimeout). */}}
{{- define "epp.compat.httpRoute" -}}
{{- $h := .Values.httpRoute -}}
{{- with .Values.experimentalHttpRoute -}}
{{- if hasKey . "enabled" }}{{ $_ := set $h "create" .enabled }}{{ end -}}
{{- with .inferenceGatewayName }}{{ $_ := set $h "inferenceGatewayName" . }}{{ end -}}
{{- with .requestTimeout }}{{ $_ := set $h "requestTimeout" . }}{{ end -}}
{{- end -}}
{{- if hasKey $h "create" -}}{{- $_ := set $h "enabled" $h.create -}}{{- end -}}
{{- with $h.inferenceGatewayName -}}{{- $_ := set $h "gatewayName" . -}}{{- end -}}
{{- with $h.inferenceGatewayNamespace -}}{{- $_ := set $h "gatewayNamespace" . -}}{{- end -}}
{{- end -}}

{{/* provider.name (llm-d's gateway chart): none, or istio (the DestinationRule epp needs). */}}
{{- define "epp.compat.provider" -}}
{{- $p := .Values.provider | default dict -}}
{{- $name := $p.name | default "none" -}}
{{- if eq $name "istio" -}}
{{- $_ := set .Values.istio.destinationRule "enabled" true -}}
{{- $dr := (($p.istio | default dict).destinationRule) | default dict -}}
{{- if or $dr.host $dr.trafficPolicy -}}
{{- fail "provider.istio.destinationRule.host/trafficPolicy: epp's chart writes its own DestinationRule (TLS to epp without verification); edit it after install or set istio.destinationRule.enabled=false and bring yours" -}}
{{- end -}}
{{- else if eq $name "gke" -}}
{{- $_ := set .Values.gke "enabled" true -}}
{{- $pb := (($p.gke | default dict).preferredBackends) | default dict -}}
{{- if $pb.enabled -}}
{{- /* llm-d's defaults (`| default`: 0 or unset is 1, RATE, 100, 100). */ -}}
{{- $_ := set .Values.gke "preferredBackends" (dict
  "enabled" true
  "preferredReplicas" (int ($pb.preferredReplicas | default 1))
  "defaultReplicas" (int ($pb.defaultReplicas | default 1))
  "balancingMode" ($pb.balancingMode | default "RATE")
  "maxRatePerEndpoint" (int ($pb.maxRatePerEndpoint | default 100))
  "capacityScalerPercent" (int ($pb.capacityScalerPercent | default 100))) -}}
{{- end -}}
{{- else if ne $name "none" -}}
{{- fail (printf "provider.name=%s: one of none, istio" $name) -}}
{{- end -}}
{{- end -}}

{{/* The EPP keys llm-d's router.epp and GIE's inferenceExtension share (both come from GIE's
epplib), with their monitoring and tracing blocks. `where` names the block in messages. */}}
{{- define "epp.compat.epp" -}}
{{- $v := .root.Values -}}
{{- $e := .epp -}}
{{- $where := .where -}}
{{- /* One replica by default; several are active-passive (leader election), as their charts. */ -}}
{{- $replicas := int ($e.replicas | default 1) -}}
{{- $_ := set $v "replicas" $replicas -}}
{{- $_ := set $v.epp "leaderElection" (gt $replicas 1) -}}
{{- with $e.image -}}
{{- if .registry }}{{ $_ := set $v.image "registry" .registry }}{{ end -}}
{{- if .repository }}{{ $_ := set $v.image "repository" .repository }}{{ end -}}
{{- if .tag }}{{ $_ := set $v.image "tag" (toString .tag) }}{{ end -}}
{{- if .pullPolicy }}{{ $_ := set $v.image "pullPolicy" .pullPolicy }}{{ end -}}
{{- end -}}
{{- if $e.extProcPort }}{{ $_ := set $v.epp "grpcPort" (int $e.extProcPort) }}{{ end -}}
{{- if $e.grpcHealthPort }}{{ $_ := set $v.epp "grpcHealthPort" (int $e.grpcHealthPort) }}{{ end -}}
{{- if and $e.parsers (ne $where "router.epp") -}}
{{- fail (printf "%s.parsers: GIE's chart has no such key; use inferencePool.parser, or put requestHandler.parsers in the scheduling config (%s.pluginsCustomConfig)" $where $where) -}}
{{- end -}}
{{- $args := list -}}
{{- with $e.metricsDataSource -}}
{{- if .scheme }}{{ $args = append $args (printf "--model-server-metrics-scheme=%s" .scheme) }}{{ end -}}
{{- if .path }}{{ $args = append $args (printf "--model-server-metrics-path=%s" .path) }}{{ end -}}
{{- if hasKey . "insecureSkipVerify" }}{{ $args = append $args (printf "--model-server-metrics-https-insecure-skip-verify=%v" .insecureSkipVerify) }}{{ end -}}
{{- end -}}
{{- /* flags: rendered as their charts render them (--key=value, keys sorted). */ -}}
{{- $flags := $e.flags | default dict -}}
{{- if and (eq $where "inferenceExtension") (not (hasKey $flags "v")) -}}
{{- /* GIE's chart default: flags: {v: 1} */ -}}
{{- $flags = merge (dict "v" 1) $flags -}}
{{- end -}}
{{- range $key, $value := $flags -}}
{{- $args = append $args (printf "--%s=%v" $key $value) -}}
{{- end -}}
{{- $_ := set $v.epp "extraArgs" (concat $args $v.epp.extraArgs) -}}
{{- $_ := set $v.epp "env" (concat $v.epp.env ($e.env | default list)) -}}
{{- /* The scheduling config: pluginsConfigFile from pluginsCustomConfig, else their charts'
default-plugins.yaml (files/default-plugins.yaml: the same weighted sum, no KV events). */ -}}
{{- $file := $e.pluginsConfigFile | default "default-plugins.yaml" -}}
{{- $custom := $e.pluginsCustomConfig | default dict -}}
{{- if hasKey $custom $file -}}
{{- if or (ne (.engine | default "vllm") "vllm") .parsers -}}
{{- fail (printf "%s and the parsers shape their default-plugins.yaml only: with pluginsConfigFile=%s, name the engine (core-metrics-extractor's defaultEngine) and requestHandler.parsers in that config" (.engineKey | default "the model server type") $file) -}}
{{- end -}}
{{- $_ := set $v "schedulingConfig" (index $custom $file) -}}
{{- else if eq $file "default-plugins.yaml" -}}
{{- $_ := set $v "schedulingConfig" (include "epp.compat.defaultPlugins" (dict "root" .root "engine" .engine "parsers" .parsers "where" .engineKey)) -}}
{{- else -}}
{{- fail (printf "%s.pluginsConfigFile=%s is not in %s.pluginsCustomConfig: epp's chart ships only default-plugins.yaml of theirs" $where $file $where) -}}
{{- end -}}
{{- $_ := set $v "extraConfigFiles" (omit $custom $file) -}}
{{- $_ := set $v.epp.kvEvents "mode" "off" -}}
{{- if $e.resources }}{{ $_ := set $v "resources" $e.resources }}{{ end -}}
{{- if $e.affinity }}{{ $_ := set $v "affinity" $e.affinity }}{{ end -}}
{{- if $e.tolerations }}{{ $_ := set $v "tolerations" $e.tolerations }}{{ end -}}
{{- if $e.podAnnotations }}{{ $_ := set $v "podAnnotations" (merge (deepCopy $e.podAnnotations) $v.podAnnotations) }}{{ end -}}
{{- if $e.extraContainerPorts }}{{ $_ := set $v.epp "extraPorts" $e.extraContainerPorts }}{{ end -}}
{{- if $e.volumes }}{{ $_ := set $v "extraVolumes" $e.volumes }}{{ end -}}
{{- if $e.volumeMounts }}{{ $_ := set $v.epp "extraVolumeMounts" $e.volumeMounts }}{{ end -}}
{{- if $e.extraServicePorts }}{{ $_ := set $v.service "extraPorts" $e.extraServicePorts }}{{ end -}}
{{- if and (hasKey $e "sidecar") ($e.sidecar | default dict).enabled -}}
{{- fail (printf "%s.sidecar: GIE's Envoy sidecar preset; use envoy.enabled=true with envoy.mode=sidecar" $where) -}}
{{- end -}}
{{- /* monitoring: a ServiceMonitor, metrics authentication (on unless turned off). */ -}}
{{- $m := .monitoring | default dict -}}
{{- $prom := $m.prometheus | default dict -}}
{{- $auth := $prom.auth | default dict -}}
{{- $_ := set $v.monitoring "metricsAuth" (ne (toString $auth.enabled) "false") -}}
{{- if $auth.secretName }}{{ $_ := set $v.monitoring "readerSecretName" $auth.secretName }}{{ end -}}
{{- $sm := $v.monitoring.serviceMonitor -}}
{{- if hasKey $prom "enabled" }}{{ $_ := set $sm "enabled" $prom.enabled }}{{ end -}}
{{- if $m.interval }}{{ $_ := set $sm "interval" $m.interval }}{{ end -}}
{{- if $prom.extraLabels }}{{ $_ := set $sm "labels" $prom.extraLabels }}{{ end -}}
{{- /* Their monitoring provider: llm-d's monitoring.provider.name, else (llm-d's legacy rule,
GIE's only one) Google Managed Prometheus on GKE, else the Prometheus Operator. */ -}}
{{- $mp := $m.provider | default dict -}}
{{- $gateway := .root.Values.provider | default dict -}}
{{- $onGke := eq (lower ($gateway.name | default "")) "gke" -}}
{{- $provider := lower ($mp.name | default (ternary "gmp" "prometheusoperator" $onGke)) -}}
{{- if eq $provider "gmp" -}}
{{- /* A PodMonitoring with the reader token, made as their charts make it: with metrics
authentication on. Autopilot's collector runs in gke-gmp-system. */ -}}
{{- $autopilot := (($gateway.gke | default dict).autopilot) | default false -}}
{{- with $mp.gmp }}{{ if hasKey . "autopilot" }}{{ $autopilot = .autopilot }}{{ end }}{{ end -}}
{{- $pm := $v.monitoring.podMonitoring -}}
{{- $_ := set $pm "enabled" (and ($prom.enabled | default false) (ne (toString $auth.enabled) "false")) -}}
{{- $_ := set $pm "collectorNamespace" (ternary "gke-gmp-system" "gmp-system" $autopilot) -}}
{{- if $m.interval }}{{ $_ := set $pm "interval" $m.interval }}{{ end -}}
{{- $_ := set $sm "enabled" false -}}
{{- else if ne $provider "prometheusoperator" -}}
{{- fail (printf "monitoring provider %s: one of prometheusoperator, gmp" $provider) -}}
{{- end -}}
{{- /* tracing: --tracing and OpenTelemetry's variables, as their charts set them. */ -}}
{{- $t := .tracing | default dict -}}
{{- if $t.enabled -}}
{{- $sampling := $t.sampling | default dict -}}
{{- $otel := list
  (dict "name" "OTEL_SERVICE_NAME" "value" "epp")
  (dict "name" "OTEL_EXPORTER_OTLP_ENDPOINT" "value" ($t.otelExporterEndpoint | default "http://localhost:4317"))
  (dict "name" "OTEL_TRACES_EXPORTER" "value" "otlp")
  (dict "name" "OTEL_RESOURCE_ATTRIBUTES_NODE_NAME" "valueFrom" (dict "fieldRef" (dict "apiVersion" "v1" "fieldPath" "spec.nodeName")))
  (dict "name" "OTEL_RESOURCE_ATTRIBUTES_POD_NAME" "valueFrom" (dict "fieldRef" (dict "apiVersion" "v1" "fieldPath" "metadata.name")))
  (dict "name" "OTEL_RESOURCE_ATTRIBUTES" "value" "k8s.namespace.name=$(NAMESPACE),k8s.node.name=$(OTEL_RESOURCE_ATTRIBUTES_NODE_NAME),k8s.pod.name=$(OTEL_RESOURCE_ATTRIBUTES_POD_NAME)")
  (dict "name" "OTEL_TRACES_SAMPLER" "value" ($sampling.sampler | default "parentbased_traceidratio"))
  (dict "name" "OTEL_TRACES_SAMPLER_ARG" "value" (toString ($sampling.samplerArg | default "0.1"))) -}}
{{- $_ := set $v.epp "env" (concat $otel $v.epp.env) -}}
{{- $_ := set $v.epp "extraArgs" (concat (list "--tracing=true") $v.epp.extraArgs) -}}
{{- end -}}
{{- end -}}

{{/* llm-d Router v0.10: router.* (and the refusals of what epp's chart does not build). */}}
{{- define "epp.compat.router" -}}
{{- $v := .Values -}}
{{- $r := .Values.router -}}
{{- $ms := $r.modelServers | default dict -}}
{{- $parsers := (($r.epp | default dict).parsers) | default list -}}
{{- if and (not $parsers) (eq ($ms.type | default "vllm") "triton") -}}
{{- $parsers = list "passthrough-parser" -}}
{{- end -}}
{{- include "epp.compat.epp" (dict "root" . "epp" ($r.epp | default dict) "monitoring" $r.monitoring "tracing" $r.tracing "where" "router.epp" "engine" ($ms.type | default "vllm") "engineKey" "router.modelServers.type" "parsers" $parsers) -}}
{{- if and $ms.protocol (ne $ms.protocol "http") -}}
{{- fail (printf "router.modelServers.protocol=%s: epp routes HTTP model servers only (llm-d's vllmgrpc-parser is not built)" $ms.protocol) -}}
{{- end -}}
{{- $p := $v.inferencePool -}}
{{- $_ := set $p "targetPorts" ($ms.targetPorts | default (list (dict "number" 8000))) -}}
{{- $ip := $r.inferencePool | default dict -}}
{{- $_ := set $p "failureMode" ($ip.failureMode | default "FailOpen") -}}
{{- if eq (toString $ip.create) "false" -}}
{{- /* llm-d-router-standalone without a pool: GIE's pool-less mode (--endpoint-selector). */ -}}
{{- $_ := set $p "create" false -}}
{{- if not $ms.matchLabels }}{{ fail "router.modelServers.matchLabels is required (the model-server pods' labels)" }}{{ end -}}
{{- $_ := set $v.pool "endpointSelector" $ms.matchLabels -}}
{{- else -}}
{{- $_ := set $p "create" true -}}
{{- if $ms.matchLabels }}{{ $_ := set $p "selector" $ms.matchLabels }}{{ end -}}
{{- end -}}
{{- with $r.inferenceObjectives }}{{ $_ := set $v "inferenceObjectives" . }}{{ end -}}
{{- with $r.extraServicePorts }}{{ $_ := set $v.service "extraPorts" . }}{{ end -}}
{{- with $r.clusterDomain }}{{ $_ := set $v "clusterDomain" . }}{{ end -}}
{{- if ($r.tokenizer | default dict).enabled -}}
{{- include "epp.compat.renderSidecar" (dict "root" . "tokenizer" $r.tokenizer) -}}
{{- end -}}
{{- if ($r.latencyPredictor | default dict).enabled -}}
{{- fail "router.latencyPredictor.enabled: llm-d's latency-predictor servers are not built; epp's own latency scorers need none (docs/configs.md)" -}}
{{- end -}}
{{- /* The proxy of llm-d-router-standalone: epp's chart's Envoy, in the pod or its own Deployment. */ -}}
{{- $proxy := $r.proxy | default dict -}}
{{- if $proxy.enabled -}}
{{- if and $proxy.proxyType (ne $proxy.proxyType "envoy") -}}
{{- fail (printf "router.proxy.proxyType=%s: epp's chart brings Envoy only" $proxy.proxyType) -}}
{{- end -}}
{{- /* router.proxy.presets are llm-d's own proxies' configs. As llm-d v0.10.0's values.yaml ships
them (`helm show values`: tests/deploy/upstream/charts.json, llm-d-standalone-shown-values) they
configure the proxy epp's chart replaces with its own; changed, they are refused below. */ -}}
{{- $llmdPresets := list "9e797a6566cc4f189e914bf6d73cc15efeea7b324a4d95d2d1cf9a198e5c2486" -}}
{{- $extra := omit $proxy "enabled" "proxyType" "mode" "replicas" "failOpen" "resources" -}}
{{- if and $proxy.presets (has (sha256sum (toYaml $proxy.presets)) $llmdPresets) -}}
{{- $extra = omit $extra "presets" -}}
{{- end -}}
{{- if $extra -}}
{{- fail (printf "router.proxy.%s: epp's chart writes its own Envoy config (envoy.*); give only enabled, mode, replicas, failOpen, resources (and presets as llm-d v0.10.0 ships them)" (keys $extra | sortAlpha | join ", router.proxy.")) -}}
{{- end -}}
{{- if and (not (kindIs "invalid" $proxy.failOpen)) (not (kindIs "bool" $proxy.failOpen)) -}}
{{- fail (printf "router.proxy.failOpen must be a boolean, got %q" (toString $proxy.failOpen)) -}}
{{- end -}}
{{- /* llm-d's values.yaml sets failOpen: true: unset, the proxy fails open, as there. */ -}}
{{- if or $proxy.failOpen (kindIs "invalid" $proxy.failOpen) }}{{ $_ := set $v.envoy "failOpen" true }}{{ end -}}
{{- $_ := set $v.envoy "enabled" true -}}
{{- $_ := set $v.envoy "mode" ($proxy.mode | default "sidecar") -}}
{{- if $proxy.replicas }}{{ $_ := set $v.envoy "replicas" (int $proxy.replicas) }}{{ end -}}
{{- if $proxy.resources }}{{ $_ := set $v.envoy "resources" $proxy.resources }}{{ end -}}
{{- /* llm-d's standalone chart exposes the proxy's listener as the Service port named http
(8081 unless extraServicePorts says otherwise). */ -}}
{{- $_ := set $v.envoy "port" 8081 -}}
{{- range ($r.extraServicePorts | default list) -}}
{{- if eq .name "http" }}{{ $_ := set $v.envoy "port" (int (.targetPort | default .port)) }}{{ end -}}
{{- end -}}

{{- end -}}
{{- end -}}

{{/* GIE v1.5: inferenceExtension.* (its pool keys are handled by "epp.compat.pool"). */}}
{{- define "epp.compat.gie" -}}
{{- $v := .Values -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $p := $v.inferencePool -}}
{{- $parsers := list -}}
{{- if $p.parser }}{{ $parsers = list $p.parser }}{{ end -}}
{{- include "epp.compat.epp" (dict "root" . "epp" $ie "monitoring" $ie.monitoring "tracing" $ie.tracing "where" "inferenceExtension" "engine" ($p.modelServerType | default "vllm") "engineKey" "inferencePool.modelServerType" "parsers" $parsers) -}}
{{- /* Consumed here: "epp.compat.pool" refuses them with epp's own values. */ -}}
{{- $_ := unset $p "modelServerType" -}}
{{- $_ := unset $p "parser" -}}
{{- $_ := set $v.inferencePool "failureMode" ($ie.failureMode | default "FailOpen") -}}
{{- $_ := set $v.inferencePool "create" true -}}
{{- $_ := set $v "inferenceObjectivesGroup" "inference.networking.x-k8s.io" -}}
{{- if $ie.latencyPredictor -}}
{{- if $ie.latencyPredictor.enabled }}{{ fail "inferenceExtension.latencyPredictor.enabled: GIE's latency-predictor servers are not built; epp's own latency scorers need none (docs/configs.md)" }}{{ end -}}
{{- end -}}
{{- end -}}

{{/* Their charts' default-plugins.yaml (files/default-plugins.yaml) for a pool's engine and
request parsers, as llm-d Router v0.10 and GIE v1.5 render it: a model server type other than
vllm becomes core-metrics-extractor's defaultEngine (the metric names epp reads), and the
parsers (router.epp.parsers; GIE's inferencePool.parser; passthrough-parser for llm-d's
`triton`) are listed as plugins and as requestHandler.parsers. The engines are the ones both
ship (epp/datastore/engines.py); a parser epp does not build is refused when epp starts. */}}
{{- define "epp.compat.defaultPlugins" -}}
{{- $text := .root.Files.Get "files/default-plugins.yaml" -}}
{{- $engines := list "vllm" "sglang" "trtllm-serve" "triton-tensorrt-llm" "triton" -}}
{{- if not (has .engine $engines) -}}
{{- fail (printf "%s=%s: one of %s" .where .engine (join ", " $engines)) -}}
{{- end -}}
{{- if or (ne .engine "vllm") .parsers -}}
{{- $cfg := fromYaml $text -}}
{{- $plugins := $cfg.plugins -}}
{{- if ne .engine "vllm" -}}
{{- $plugins = append $plugins (dict "type" "core-metrics-extractor" "parameters" (dict "defaultEngine" .engine)) -}}
{{- end -}}
{{- $refs := list -}}
{{- range .parsers -}}
{{- $plugins = append $plugins (dict "type" .) -}}
{{- $refs = append $refs (dict "pluginRef" .) -}}
{{- end -}}
{{- $_ := set $cfg "plugins" $plugins -}}
{{- if $refs }}{{ $_ := set $cfg "requestHandler" (dict "parsers" $refs) }}{{ end -}}
{{- printf "# Their charts' default-plugins.yaml for %s=%s (epp's chart, templates/_compat.tpl).\n%s" .where .engine (toYaml $cfg) -}}
{{- else -}}
{{- $text -}}
{{- end -}}
{{- end -}}

{{/* llm-d v0.10's render sidecar (router.tokenizer.enabled): `vllm launch render` beside epp,
as llm-d's chart renders it (its defaults from its values.yaml, the user's keys over them), with
the pod's `model-cache` volume and the user's volumes and init containers. The scheduling config
names it, as with llm-d: a token-producer with `vllm: {url: "http://localhost:<port>"}`.
The vLLM images run as root and keep the model under /root/.cache/huggingface, which epp's
non-root pod user (65532) cannot reach: the sidecar runs as root, as in llm-d's pod. */}}
{{- define "epp.compat.renderSidecar" -}}
{{- $v := .root.Values -}}
{{- $defaults := dict
  "image" (dict "registry" "docker.io" "repository" "vllm/vllm-openai-cpu" "tag" "v0.19.1" "pullPolicy" "IfNotPresent")
  "port" 8000
  "env" (list (dict "name" "HF_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" "llm-d-hf-token" "key" "HF_TOKEN"))))
  "resources" (dict "requests" (dict "cpu" "4" "memory" "8Gi"))
  "readinessProbe" (dict "httpGet" (dict "path" "/health" "port" "render-http") "initialDelaySeconds" 30 "periodSeconds" 10 "timeoutSeconds" 5 "failureThreshold" 60) -}}
{{- $t := merge (deepCopy .tokenizer) $defaults -}}
{{- if not $t.modelName -}}
{{- fail "router.tokenizer.modelName is required when the tokenizer is enabled" -}}
{{- end -}}
{{- $port := int $t.port -}}
{{- $args := $t.args | default (list $t.modelName (printf "--port=%d" $port)) -}}
{{- $c := dict
  "name" "vllm-render"
  "image" (printf "%s/%s:%s" $t.image.registry $t.image.repository (toString $t.image.tag))
  "imagePullPolicy" ($t.image.pullPolicy | default "IfNotPresent")
  "command" ($t.command | default (list "vllm" "launch" "render"))
  "args" (concat $args ($t.extraArgs | default list))
  "ports" (list (dict "name" "render-http" "containerPort" $port))
  "volumeMounts" (concat (list (dict "name" "model-cache" "mountPath" "/root/.cache/huggingface")) ($t.volumeMounts | default list))
  "securityContext" (dict "runAsUser" 0 "runAsGroup" 0 "runAsNonRoot" false) -}}
{{- with $t.readinessProbe }}{{ $_ := set $c "readinessProbe" . }}{{ end -}}
{{- with $t.env }}{{ $_ := set $c "env" . }}{{ end -}}
{{- with $t.resources }}{{ $_ := set $c "resources" . }}{{ end -}}
{{- $_ := set $v "extraContainers" (append ($v.extraContainers | default list) $c) -}}
{{- $volumes := concat (list (dict "name" "model-cache" "emptyDir" dict)) ($t.volumes | default list) -}}
{{- $_ := set $v "extraVolumes" (concat ($v.extraVolumes | default list) $volumes) -}}
{{- $_ := set $v "initContainers" (concat ($v.initContainers | default list) ($t.initContainers | default list)) -}}
{{- end -}}
