//go:build tools

// Pins Kueue's manager command in go.mod and go.sum;
// `go build sigs.k8s.io/kueue/cmd/kueue` builds it.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
