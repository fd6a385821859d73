{{- define "petrel.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name, or release-chart when it does not hold the chart's name. */}}
{{- define "petrel.fullname" -}}
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

{{- define "petrel.selectorLabels" -}}
app.kubernetes.io/name: {{ include "petrel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ include "petrel.component" . }}
{{- end -}}

{{/* agent (mode node: the DaemonSet) or aggregator. */}}
{{- define "petrel.component" -}}
{{- if eq .Values.mode "aggregator" -}}aggregator{{- else -}}agent{{- end -}}
{{- end -}}

{{/* --data-dir: the host's directory (node), an emptyDir (aggregator: the
kafka source keeps no local state, its offsets are committed in Kafka). */}}
{{- define "petrel.dataDir" -}}
{{- if eq .Values.mode "aggregator" -}}/var/lib/petrel{{- else -}}{{ .Values.hostPaths.data }}{{- end -}}
{{- end -}}

{{/* The agent's container but its name, securityContext and volumeMounts:
the same image, args, env, port, resources and probes in both modes. */}}
{{- define "petrel.container" -}}
image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
imagePullPolicy: {{ .Values.image.pullPolicy }}
args:
  - run
  - --config=/etc/petrel/pipelines/
  - --data-dir={{ include "petrel.dataDir" . }}
  - --api-addr=0.0.0.0:{{ .Values.apiPort }}
  - --log-format={{ .Values.logFormat }}
  - --threads={{ .Values.threads }}
  - --memory-limit={{ .Values.memoryLimit }}
  - --shutdown-timeout={{ .Values.shutdownTimeout }}
  {{- if .Values.api.tls.enabled }}
  - --api-tls-cert=/etc/petrel/api-tls/tls.crt
  - --api-tls-key=/etc/petrel/api-tls/tls.key
  {{- if .Values.api.tls.clientAuth }}
  - --api-tls-client-ca=/etc/petrel/api-tls/ca.crt
  {{- end }}
  {{- end }}
  {{- if ne .Values.api.auth "control" }}
  - --api-auth={{ .Values.api.auth }}
  {{- end }}
  {{- if .Values.api.tokenSecret.name }}
  - --api-token-file=/etc/petrel/api-token/{{ .Values.api.tokenSecret.key }}
  {{- end }}
  {{- range .Values.extraArgs }}
  - {{ . | quote }}
  {{- end }}
env:
  # The node name in every event (the source reads $NODE_NAME).
  - name: NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  {{- range .Values.secrets }}
  - name: {{ .name }}
    valueFrom:
      secretKeyRef:
        name: {{ .secretName }}
        key: {{ .key }}
        {{- if hasKey . "optional" }}
        optional: {{ .optional }}
        {{- end }}
  {{- end }}
  {{- with .Values.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: api
    containerPort: {{ .Values.apiPort }}
    protocol: TCP
{{- with .Values.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
# Ready: the pipelines run and every sink delivers.
readinessProbe:
  httpGet:
    path: /health/ready
    port: api
    {{- if .Values.api.tls.enabled }}
    scheme: HTTPS
    {{- end }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
# Live: no internal thread dead or stuck (a down collector does
# not fail it: a restart would not bring it back).
livenessProbe:
  httpGet:
    path: /health/live
    port: api
    {{- if .Values.api.tls.enabled }}
    scheme: HTTPS
    {{- end }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{/* The API's TLS Secret and token Secret, mounted read-only (both modes). */}}
{{- define "petrel.apiVolumeMounts" -}}
{{- if .Values.api.tls.enabled }}
- name: api-tls
  mountPath: /etc/petrel/api-tls
  readOnly: true
{{- end }}
{{- if .Values.api.tokenSecret.name }}
- name: api-token
  mountPath: /etc/petrel/api-token
  readOnly: true
{{- end }}
{{- end -}}

{{- define "petrel.apiVolumes" -}}
{{- if .Values.api.tls.enabled }}
# Mounted as a directory, not with subPath: kubelet swaps the directory's
# symlink when the Secret is renewed, and the agent reads the new pair.
- name: api-tls
  secret:
    secretName: {{ .Values.api.tls.secretName }}
{{- end }}
{{- if .Values.api.tokenSecret.name }}
- name: api-token
  secret:
    secretName: {{ .Values.api.tokenSecret.name }}
{{- end }}
{{- end -}}

{{- define "petrel.prometheusAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.apiPort | quote }}
prometheus.io/path: /metrics
{{- if .Values.api.tls.enabled }}
prometheus.io/scheme: https
{{- end }}
{{- end -}}

{{/* Labels of every object; the workloads add app.kubernetes.io/component. */}}
{{- define "petrel.labels" -}}
app.kubernetes.io/name: {{ include "petrel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The DaemonSet's ServiceAccount: the one named in serviceAccountName, or
the one rbac.create makes (named after the release); "" when neither. */}}
{{- define "petrel.serviceAccountName" -}}
{{- if .Values.serviceAccountName -}}
{{ .Values.serviceAccountName }}
{{- else if .Values.rbac.create -}}
{{ include "petrel.fullname" . }}
{{- end -}}
{{- end -}}
