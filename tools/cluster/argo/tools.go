//go:build tools

// Package tools pins Argo's workflow-controller command, built from the v4.1.2 source in
// ../shared (go.mod replaces the module with it, as ../../argo-sim does; go.sum starts from
// Argo's own). The e2e tests run it against the real API server of tests/e2e/cluster.py, and
// the real node's pods run its executor, argoexec (tests/e2e/images.py).
package tools

import (
	_ "github.com/argoproj/argo-workflows/v4/cmd/argoexec"
	_ "github.com/argoproj/argo-workflows/v4/cmd/workflow-controller"
)
