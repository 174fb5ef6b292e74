{{/* Chart name, overridable. */}}
{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: fullnameOverride, else the release name if it contains the chart
name, else "<release>-<chart>". Kept at 52 characters so that
"<fullname>-controller" and "<fullname>-controller-provision" stay within 63.
*/}}
{{- define "tollgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the controller's Deployment, Service, ServiceAccount, Role... */}}
{{- define "tollgate.controller" -}}
{{- printf "%s-controller" (include "tollgate.fullname" .) }}
{{- end }}

{{- define "tollgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "tollgate.labels" -}}
helm.sh/chart: {{ include "tollgate.chart" . }}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of the controller pods (immutable in a Deployment). */}}
{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "tollgate.controllerImage" -}}
{{- printf "%s:%s" .Values.controller.image.repository (default .Chart.AppVersion .Values.controller.image.tag) }}
{{- end }}

{{- define "tollgate.proxyImage" -}}
{{- printf "%s:%s" .Values.proxy.image.repository (default .Chart.AppVersion .Values.proxy.image.tag) }}
{{- end }}

{{/* URL provisioned proxies dial: the controller Service's push port. */}}
{{- define "tollgate.controllerUrl" -}}
{{- printf "https://%s.%s.svc:%v" (include "tollgate.controller" .) .Release.Namespace .Values.controller.push.port }}
{{- end }}

{{/*
Writes in Gateway namespaces: the provisioned kinds (ServiceAccount, Deployment,
Service per Gateway) and the proxy TLS Secrets. RBAC cannot match names by
prefix, so these cannot be narrowed further than by namespace.
*/}}
{{- define "tollgate.writeRules" -}}
{{- if .Values.provision.enabled }}
- apiGroups: [""]
  resources: ["serviceaccounts", "services"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
{{- end }}
{{- if .Values.controller.push.enabled }}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "update", "patch"]
{{- end }}
{{- end }}
