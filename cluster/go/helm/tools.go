//go:build tools

// Package tools pins the helm command that `make cluster` builds for the local test cluster.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
