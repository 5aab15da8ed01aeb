// The e2e control plane's Kueue: Kueue v0.17.0's cmd/kueue/main.go, put beside this file with
// `go build -overlay` by tests/e2e/cluster.py (Go allows no overlay inside the module cache),
// with one change: it calls this function where v0.17.0 writes a fixed path.
//
// Without its internal certificate management (which issues certificates for a Service, while
// the e2e control plane calls the webhooks on 127.0.0.1), Kueue v0.17.0 reads its metrics
// server's certificate from the fixed directory /etc/kueue/metrics/certs and exits when it is
// missing, even with metrics off. The e2e cluster keeps all its state in its own directory, so
// the directory comes from DURAPIPE_KUEUE_METRICS_CERTS, and is Kueue's own without it.
package main

import "os"

func durapipeMetricsCertPath() string {
	if dir := os.Getenv("DURAPIPE_KUEUE_METRICS_CERTS"); dir != "" {
		return dir
	}
	return "/etc/kueue/metrics/certs"
}
