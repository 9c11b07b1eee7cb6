#!/usr/bin/env bash
# Builds the local test cluster's programs from their Go modules into a cache outside the
# checkout (K8S_CACHE, default ~/.cache/tianji/k8s-<version>): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes with its staging
# modules at their published versions), CoreDNS (our plugin selection), helm and Prometheus
# (with Kubernetes service discovery).
# Each module's binaries are rebuilt only when its go.mod/go.sum/sources changed: a warm run
# takes seconds. Only go.mod, go.sum and our small main files are in the repository.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go/k8s/go.mod")"
cache="${K8S_CACHE:-$HOME/.cache/tianji/k8s-$version}"
bin="$cache/bin"
mkdir -p "$bin"
export GOFLAGS="${GOFLAGS:--mod=mod}" CGO_ENABLED=0

build() {  # build MODULE_DIR LDFLAGS PACKAGE...: go build the packages into $bin unless up to date
  local dir="$1" ldflags="$2"; shift 2
  local stamp="$cache/.$(basename "$dir").stamp"
  local sum
  local tags="${PROM_TAGS:-}"
  sum="$(cd "$here/go/$dir" && cat go.mod go.sum $(ls *.go 2>/dev/null) | sha256sum | cut -c1-16)-$ldflags-$tags-$*"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$sum" ]]; then
    echo "cluster: $dir binaries up to date in $bin"; return
  fi
  echo "cluster: building $dir ($*) into $bin (a cold build takes many minutes on 2 cores)"
  local t0=$SECONDS
  (cd "$here/go/$dir" && go build -tags="$tags" -ldflags="-s -w $ldflags" -o "$bin/" "$@")
  echo "$sum" > "$stamp"
  echo "cluster: $dir built in $((SECONDS - t0)) s"
}

# The version the API server reports (/version; helm checks charts' kubeVersion against it).
minor="$(echo "$version" | cut -d. -f2)"
k8s_version=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_version+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
build k8s "$k8s_version" go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl
[[ -x "$bin/server" ]] && mv -f "$bin/server" "$bin/etcd"   # the etcd module's main package is named server
build dns "" .
[[ -x "$bin/dns" ]] && mv -f "$bin/dns" "$bin/coredns"
build helm "" helm.sh/helm/v4/cmd/helm
# Prometheus with Kubernetes service discovery (Debian's package has none): the autoscaler tests.
PROM_TAGS="remove_all_sd,enable_kubernetes_sd" build prometheus "" github.com/prometheus/prometheus/cmd/prometheus
echo "$bin"
