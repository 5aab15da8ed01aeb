//go:build tools

// Package argosim only pins the Argo module (and, through `go get -t`, its controller's test
// dependencies) in go.mod/go.sum. The harness itself is harness/zz_argosim_test.go, which is
// compiled into Argo's workflow/controller package with `go test -overlay`.
package argosim

import _ "github.com/argoproj/argo-workflows/v4/workflow/controller"
