//go:build tools

// The kubelet's main package is built by path (`go build
// k8s.io/kubernetes/cmd/kubelet`); this keeps its packages in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet/app"
)
