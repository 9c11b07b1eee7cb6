//go:build tools

// Package tools pins the Prometheus that the cluster tier runs: Debian's package is built
// without Kubernetes service discovery. build.sh builds it with only that discovery
// (tags remove_all_sd,enable_kubernetes_sd); its web UI assets are left out, the API serves.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
