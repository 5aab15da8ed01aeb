//go:build tools

// Package tools pins the control-plane binaries the end-to-end tests start:
// blank imports keep their packages in this module's graph so `go mod tidy`
// records every dependency; tests/e2e/cluster.py builds each one with
// `go build <package>` from this directory.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
