// CoreDNS from its published module (github.com/coredns/coredns), with
// only the plugins the Corefile kubeadm writes uses: building every
// plugin (coredns.go's core/plugin) drags in cloud SDKs the cluster test
// never runs. Plugin order is CoreDNS's own (its zdirectives.go): a
// directive not listed here is unknown to this server.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The plugins above, in the order CoreDNS's full build chains them.
var order = []string{"reload", "ready", "health", "prometheus", "errors", "log", "loadbalance", "cache", "loop", "kubernetes", "forward"}

func main() {
	keep := map[string]bool{}
	for _, d := range order {
		keep[d] = true
	}
	var directives []string
	for _, d := range dnsserver.Directives {
		if keep[d] {
			directives = append(directives, d)
		}
	}
	dnsserver.Directives = directives
	coremain.Run()
}
