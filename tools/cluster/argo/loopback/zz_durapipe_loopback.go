// Added to Argo's cmd/workflow-controller (package main) with `go build -overlay` by
// tests/e2e/cluster.py; no Argo file is copied or edited.
//
// Argo v4.1.2's main serves /healthz with http.ListenAndServe(":6060"), on every interface and
// on a fixed port. The e2e cluster must listen on 127.0.0.1 only, so this init, which runs
// before main, takes 127.0.0.1:6060 first and serves the same default mux there. Argo's own
// listen on ":6060" then fails with "address already in use", which main only logs. When the
// loopback port is already taken (another controller on this machine), Argo's wildcard listen
// fails the same way, so nothing of ours listens beyond 127.0.0.1 either way.
package main

import (
	"net"
	"net/http"
)

func init() {
	ln, err := net.Listen("tcp", "127.0.0.1:6060")
	if err != nil {
		return
	}
	go func() { _ = http.Serve(ln, nil) }()
}
