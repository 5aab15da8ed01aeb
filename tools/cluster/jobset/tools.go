//go:build tools

// Package tools pins JobSet v0.12.0's controller manager (its module's main package), built
// from the source in ../shared. A module of its own: JobSet builds against k8s.io/api v0.36 and
// controller-runtime v0.24, the control plane (../k8s) against v0.35.
package tools

import _ "sigs.k8s.io/jobset"
