{{/* An image reference from images.<name>. */}}
{{- define "shoal.image" -}}
{{- $image := index .root.Values.images .name -}}
{{ $image.repository }}:{{ $image.tag }}
{{- end -}}

{{/* imagePullPolicy, when one is set. */}}
{{- define "shoal.pullPolicy" -}}
{{- with .Values.images.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end -}}
{{- end -}}
