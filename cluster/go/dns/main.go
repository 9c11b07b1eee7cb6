// Command coredns is CoreDNS with only the plugins a local TianJi test cluster uses:
// cluster DNS from the API (kubernetes), with health/ready endpoints and a short cache.
// It is the CoreDNS that clusters run, built without the cloud back ends (faster to build).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The order in which the plugins see a query: CoreDNS's plugin.cfg order, restricted to ours.
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}
}

func main() { coremain.Run() }
