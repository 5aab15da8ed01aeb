// Command coredns-e2e is a minimal CoreDNS build that serves cluster DNS
// (the kubernetes plugin) to pods on the test Kubernetes node.
//
// It follows CoreDNS's documented way of building with a chosen set of
// plugins: blank-import only the plugins needed and set dnsserver.Directives
// to them, in the relative order of CoreDNS's plugin.cfg. It deliberately
// does not import github.com/coredns/coredns/core/plugin, which pulls in every
// plugin and, with them, cloud SDKs (route53, azure, clouddns, ...) that cost
// build time and binary size for nothing here. There is no upstream network on
// the test node, so forward and loop are left out too.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func init() {
	// Order matters: it is the order in which plugins handle a query.
	// Keep it consistent with CoreDNS's plugin.cfg.
	dnsserver.Directives = []string{
		"bind",
		"errors",
		"log",
		"cache",
		"kubernetes",
	}
}

func main() {
	coremain.Run()
}
