{{/* Chart name. */}}
{{- define "reprieve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "reprieve.fullname" -}}
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

{{- define "reprieve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "reprieve.labels" -}}
helm.sh/chart: {{ include "reprieve.chart" . }}
{{ include "reprieve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels. */}}
{{- define "reprieve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reprieve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "reprieve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "reprieve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The chart's PriorityClass name. */}}
{{- define "reprieve.priorityClass" -}}
{{- printf "%s-operator" (include "reprieve.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The operator pods' priority class: priorityClassName, else the chart's own when it creates one. */}}
{{- define "reprieve.priorityClassName" -}}
{{- if .Values.priorityClassName }}
{{- .Values.priorityClassName }}
{{- else if .Values.priorityClass.create }}
{{- include "reprieve.priorityClass" . }}
{{- end }}
{{- end }}

{{/*
The operator pods' affinity: the user's `affinity`, plus the spot-avoiding node expressions ANDed into each of
its required node terms (one term of their own when it has none; Kubernetes ORs terms, so adding a term would
let every spot node back in), plus a preferred anti-affinity over nodes unless it has a podAntiAffinity.
*/}}
{{- define "reprieve.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) }}
{{- $avoid := list }}
{{- if .Values.avoidSpotNodes.enabled }}
{{- range $key, $values := .Values.avoidSpotNodes.nodeLabels }}
{{- if $values }}
{{- $avoid = append $avoid (dict "key" $key "operator" "NotIn" "values" $values) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $avoid }}
{{- $node := get $affinity "nodeAffinity" | default dict }}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
{{- $terms := list }}
{{- range (get $required "nodeSelectorTerms" | default list) }}
{{- $term := deepCopy . }}
{{- $_ := set $term "matchExpressions" (concat (get $term "matchExpressions" | default list) $avoid) }}
{{- $terms = append $terms $term }}
{{- end }}
{{- if not $terms }}
{{- $terms = list (dict "matchExpressions" $avoid) }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $terms }}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ := set $affinity "nodeAffinity" $node }}
{{- end }}
{{- if and .Values.spreadReplicas (gt (int .Values.replicaCount) 1) (not (hasKey $affinity "podAntiAffinity")) }}
{{- $term := dict "labelSelector" (dict "matchLabels" (include "reprieve.selectorLabels" . | fromYaml))
      "topologyKey" "kubernetes.io/hostname" }}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution"
      (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- if $affinity }}
{{- toYaml $affinity }}
{{- end }}
{{- end }}
