//go:build tools

// The Kubernetes binaries the tests run are built by path in one `go
// build` (scripts/deps.sh): the kubelet, kubeadm and kubectl, and the
// four control-plane programs a release ships as images. This keeps
// their packages in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-proxy/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kubeadm/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
	_ "k8s.io/kubectl/pkg/cmd"
)
