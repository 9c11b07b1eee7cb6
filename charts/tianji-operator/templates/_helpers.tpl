{{/*
Object names. The pod label app.kubernetes.io/name is always "tianji-operator":
the NetworkPolicy the operator writes for each job admits pods with that label
to the job pods' metrics port (the operator scrapes them when no Prometheus URL is set).
*/}}
{{- define "tianji-operator.name" -}}
tianji-operator
{{- end -}}

{{- define "tianji-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "tianji-operator" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-tianji-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tianji-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tianji-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tianji-operator.labels" -}}
{{ include "tianji-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tianji
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "tianji-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tianji-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tianji-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Namespaces the operator watches when RBAC is namespaced (default: the release namespace). */}}
{{- define "tianji-operator.watchNamespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- toJson .Values.watchNamespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{- define "tianji-operator.namespaced" -}}
{{- if eq .Values.rbac.scope "namespaced" }}true{{ end -}}
{{- end -}}
