//go:build tools

// Package argosim only pins the Argo module and its controller's and executor's test
// dependencies in go.mod/go.sum: made by copying Argo v4.1.2's go.sum (from ../shared; without
// it one pseudo-version is refused by the checksum database) and then `go get -t` of
// ./workflow/controller and ./workflow/executor of the replaced module. `go mod tidy` would
// drop the test dependencies, so do not tidy this module. The harness itself is harness/zz_argosim_test.go, which is
// compiled into Argo's workflow/controller package with `go test -overlay`.
package argosim

import (
	_ "github.com/argoproj/argo-workflows/v4/workflow/controller"
	_ "github.com/argoproj/argo-workflows/v4/workflow/executor"
)
