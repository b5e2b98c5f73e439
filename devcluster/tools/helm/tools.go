//go:build tools

// Pins helm's command in go.mod and go.sum; `go build helm.sh/helm/v4/cmd/helm` builds it.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
