//go:build tools

// The kubelet's and kubeadm's main packages are built by path (`go build
// k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubeadm`); this
// keeps their packages in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
)
