//go:build tools

// Pins the Kubeflow training-operator's command in go.mod and go.sum;
// `go build github.com/kubeflow/training-operator/cmd/training-operator.v1` builds it.
package tools

import _ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
