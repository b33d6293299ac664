{{/*
Names, labels and the environment of the relay's containers.

Settings reach a container as environment variables, by the names docs/configuration.md
lists: each container gets, of `config` (and of its own `config` on top), only the variables
its command reads (templates/_settings.tpl, generated from --help by scripts/gen-chart), so
the cleanup job carries no `run`-only setting. Connection strings and Kafka credentials come
from Secrets only (`secretEnv`): values.schema.json refuses them anywhere else.
*/}}

{{- define "outbox-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "outbox-relay.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "outbox-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-relay.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "outbox-relay.labels" -}}
{{ include "outbox-relay.selectorLabels" . }}
{{- if .root.Values.chartLabels }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end }}
{{- end -}}

{{- define "outbox-relay.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The default name of the Secret behind a secretEnv entry that names none. */}}
{{- define "outbox-relay.secretName" -}}
{{- $suffix := dict "DATABASE_URL" "db" "OUTBOX_KAFKA_PROPERTIES" "kafka" -}}
{{- if .ref.name -}}
{{- .ref.name -}}
{{- else if hasKey $suffix .env -}}
{{- printf "%s-%s" (include "outbox-relay.fullname" .root) (get $suffix .env) -}}
{{- else -}}
{{- fail (printf "secretEnv.%s.name: name the Secret that holds %s" .env .env) -}}
{{- end -}}
{{- end -}}

{{/*
A value as the relay reads it from the environment. Numbers come out of YAML as float64,
and "%v" of 1048576.0 is 1.048576e+06: integers are printed as integers.
*/}}
{{- define "outbox-relay.envValue" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- int64 . | toString | quote -}}
{{- else -}}
{{- toString . | quote -}}
{{- end -}}
{{- end -}}

{{/*
The env list of a container running `outbox-relay <command>`:
  dict "root" $ "command" "run|cleanup|check" "config" (the workload's own config, or nil)
*/}}
{{- define "outbox-relay.env" -}}
{{- $root := .root -}}
{{- $reads := include (printf "outbox-relay.reads.%s" .command) $root | splitList " " -}}
{{- $config := mergeOverwrite (deepCopy ($root.Values.config | default dict)) (deepCopy (.config | default dict)) -}}
{{- if has "OUTBOX_METRICS_ADDR" $reads }}
{{- $_ := set $config "OUTBOX_METRICS_ADDR" (printf "0.0.0.0:%d" (int64 $root.Values.metrics.port)) -}}
{{- end }}
{{- range $name, $ref := $root.Values.secretEnv }}
{{- if and $ref (has $name $reads) }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "outbox-relay.secretName" (dict "root" $root "env" $name "ref" $ref) }}
      key: {{ $ref.key }}
      {{- if $ref.optional }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}
{{- range $name, $value := $config }}
{{- if and (has $name $reads) (not (kindIs "invalid" $value)) }}
- name: {{ $name }}
  value: {{ include "outbox-relay.envValue" $value }}
{{- end }}
{{- end }}
{{- with $root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* `--kafka-property=k=v` for every kafka.properties entry (strings: the schema says so).
     These flags and the Secret's OUTBOX_KAFKA_PROPERTIES add up: the relay reads both. */}}
{{- define "outbox-relay.kafkaArgs" -}}
{{- range $k, $v := .Values.kafka.properties }}
- {{ printf "--kafka-property=%s=%s" $k $v | quote }}
{{- end }}
{{- end -}}

{{/* Checks across values that a schema cannot express; each names the setting. */}}
{{- define "outbox-relay.validate" -}}
{{- $defaults := include "outbox-relay.defaults" . | fromJson -}}
{{- $config := mergeOverwrite (deepCopy $defaults) (deepCopy (.Values.config | default dict)) -}}
{{- $shutdownMs := int64 (get $config "OUTBOX_SHUTDOWN_TIMEOUT_MS") -}}
{{- $graceMs := mul (int64 .Values.terminationGracePeriodSeconds) 1000 -}}
{{- if le $graceMs (add $shutdownMs 1500) -}}
{{- fail (printf "terminationGracePeriodSeconds (%d s) must outlast config.OUTBOX_SHUTDOWN_TIMEOUT_MS (%d ms) plus 1.5 s: the kubelet would SIGKILL the relay while it drains" (int64 .Values.terminationGracePeriodSeconds) $shutdownMs) -}}
{{- end -}}
{{- if and .Values.podDisruptionBudget.enabled (not (kindIs "invalid" .Values.podDisruptionBudget.maxUnavailable)) -}}
{{- if lt (int64 .Values.podDisruptionBudget.maxUnavailable) (int64 .Values.replicaCount) -}}
{{- fail (printf "podDisruptionBudget.maxUnavailable (%d) below replicaCount (%d) would block every node drain: only the pod holding the slot is ready, so a standby never counts as available" (int64 .Values.podDisruptionBudget.maxUnavailable) (int64 .Values.replicaCount)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
