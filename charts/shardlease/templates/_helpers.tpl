{{/* Name of the chart, overridable. */}}
{{- define "shardlease.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's namespaced objects (63 characters at most). */}}
{{- define "shardlease.fullname" -}}
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

{{- define "shardlease.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardlease.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardlease.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "shardlease.labels" -}}
helm.sh/chart: {{ include "shardlease.chart" . }}
{{ include "shardlease.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shardlease
{{- end }}

{{/* Labels of cluster-scoped and shared objects (no component). */}}
{{- define "shardlease.commonLabels" -}}
helm.sh/chart: {{ include "shardlease.chart" . }}
app.kubernetes.io/name: {{ include "shardlease.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shardlease
{{- end }}

{{- define "shardlease.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "shardlease.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image of the operator and of the injected agent sidecar. */}}
{{- define "shardlease.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* Fixed names of the cluster-scoped objects (one release per cluster). */}}
{{- define "shardlease.operatorClusterRole" -}}shardlease-operator{{- end }}
{{- define "shardlease.agentClusterRole" -}}shardlease-agent{{- end }}
{{- define "shardlease.webhookConfigName" -}}shardlease{{- end }}

{{/* Secret holding the webhook's tls.crt, tls.key and ca.crt. helm owns the
one it generates; cert-manager owns its own, under another name, so that
switching modes never asks helm to adopt a Secret it did not create. */}}
{{- define "shardlease.webhookSecretName" -}}
{{- if .Values.webhook.certManager.enabled }}
{{- printf "%s-webhook-cm-tls" (include "shardlease.fullname" .) }}
{{- else }}
{{- printf "%s-webhook-tls" (include "shardlease.fullname" .) }}
{{- end }}
{{- end }}

{{- define "shardlease.webhookPath" -}}/inject-agent{{- end }}

{{/*
The injected agent's settings, as the JSON `shardlease operator --agent-config` reads.
(The log defaults stand for values a `helm upgrade --reuse-values` from an
older chart does not have.)
*/}}
{{- define "shardlease.agentConfig" -}}
{{- $a := .Values.agent -}}
{{- $cfg := dict "imagePullPolicy" ($a.imagePullPolicy | default .Values.image.pullPolicy) "resources" $a.resources "env" $a.env "envFrom" $a.envFrom "logFormat" ($a.logFormat | default "text") "logLevel" ($a.logLevel | default "info") -}}
{{- $secrets := list -}}
{{- range .Values.imagePullSecrets }}{{ $secrets = append $secrets .name }}{{ end -}}
{{- $_ := set $cfg "imagePullSecrets" $secrets -}}
{{- if not (kindIs "invalid" $a.nativeSidecar) }}{{ $_ := set $cfg "nativeSidecar" $a.nativeSidecar }}{{ end -}}
{{- toJson $cfg -}}
{{- end }}
