//go:build tools

// Package tools pins Kueue v0.17.0's controller manager (sigs.k8s.io/kueue/cmd/kueue), served
// by the Go module proxy. A module of its own: Kueue builds against controller-runtime v0.23
// and JobSet's v0.11 API, beside the control plane's and JobSet's own versions.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
