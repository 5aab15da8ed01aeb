//go:build tools

// Package tools pins KWOK, which plays the kubelets of the e2e cluster's fake nodes. It is a
// module of its own because KWOK v0.8.0 builds against k8s.io/api v0.36, the control plane
// (../k8s) against v0.35.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
