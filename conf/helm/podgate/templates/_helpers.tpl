{{/* The image every container runs: repository:tag, @digest when given. */}}
{{- define "podgate.image" -}}
{{- $i := .Values.image -}}
{{- if $i.digest -}}
{{ $i.repository }}{{ if $i.tag }}:{{ $i.tag }}{{ end }}@{{ $i.digest }}
{{- else -}}
{{ $i.repository }}:{{ $i.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* Labels of every object: podgate's own, then Helm's. */}}
{{- define "podgate.labels" -}}
app.kubernetes.io/name: {{ .name }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/*
The policy digest: sha256 of the podgate-router entry's canonical JSON
(object keys sorted, no whitespace), as `podgate admission digest` computes
it. toJson sorts keys and writes no whitespace; it escapes <, > and & where
serde_json does not, so those are put back.
*/}}
{{- define "podgate.policyDigest" -}}
{{- $entries := fromJsonArray .Values.policy -}}
{{- $routers := list -}}
{{- range $entries -}}
{{- if not (kindIs "map" .) -}}
{{- fail (printf "policy: not a JSON array of plugin entries: %v" .) -}}
{{- end -}}
{{- if eq (get . "type") "podgate-router" -}}
{{- $routers = append $routers . -}}
{{- end -}}
{{- end -}}
{{- if ne (len $routers) 1 -}}
{{- fail (printf "policy: %d podgate-router entries; the policy needs exactly one" (len $routers)) -}}
{{- end -}}
{{- $json := toJson (first $routers) | replace "\\u003c" "<" | replace "\\u003e" ">" | replace "\\u0026" "&" -}}
sha256:{{ sha256sum $json }}
{{- end -}}

{{/* A container's securityContext: root, no privilege, the given capabilities. */}}
{{- define "podgate.securityContext" -}}
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
  {{- with . }}
  add: {{ toJson . }}
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The pod spec fields both DaemonSets share. */}}
{{- define "podgate.podSpec" -}}
serviceAccountName: podgate
automountServiceAccountToken: false
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
hostNetwork: true
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.image.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
terminationGracePeriodSeconds: 10
securityContext:
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/* The host dirs both DaemonSets mount: the CNI dirs and podgate's state. */}}
{{- define "podgate.hostPaths" -}}
- name: cni-bin
  hostPath:
    path: {{ .Values.cni.binDir }}
    type: DirectoryOrCreate
- name: cni-conf
  hostPath:
    path: {{ .Values.cni.confDir }}
    type: DirectoryOrCreate
- name: state
  hostPath:
    path: /var/lib/cni/podgate
    type: DirectoryOrCreate
- name: installer-state
  hostPath:
    path: /var/lib/podgate/installer
    type: DirectoryOrCreate
{{- end -}}
