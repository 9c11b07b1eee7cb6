#!/usr/bin/env bash
# Builds the local test cluster's programs from their Go modules into a cache outside the
# checkout (K8S_CACHE, default ~/.cache/tianji/k8s-<version>): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes with its staging
# modules at their published versions), CoreDNS (our plugin selection), helm and Prometheus
# (with Kubernetes service discovery); for real nodes (cluster/localcluster/realnode.py) the
# kubelet, containerd with its runc shim, the CNI plugins, a registry (distribution), crane and
# kube-network-policies at the versions pinned below, and the probe image's program.
# Each module's binaries are rebuilt only when its go.mod/go.sum/sources changed: a warm run
# takes seconds. Only go.mod, go.sum and our small main files are in the repository.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go/k8s/go.mod")"
cache="${K8S_CACHE:-$HOME/.cache/tianji/k8s-$version}"
bin="$cache/bin"
mkdir -p "$bin"
export GOFLAGS="${GOFLAGS:--mod=mod}" CGO_ENABLED=0

install_at() {  # install_at NAME VERSION PACKAGE...: go install each PACKAGE@VERSION into $bin unless up to date
  local name="$1" version="$2"; shift 2
  local stamp="$cache/.$name.stamp" sum="$version ${*} ${INSTALL_TAGS:-}"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$sum" ]]; then
    echo "cluster: $name up to date in $bin"; return
  fi
  echo "cluster: building $name $version into $bin"
  local t0=$SECONDS pkg
  for pkg in "$@"; do
    (cd "$cache" && GOFLAGS= GOBIN="$bin" go install -tags="${INSTALL_TAGS:-}" -ldflags="-s -w" "$pkg@$version")
  done
  echo "$sum" > "$stamp"
  echo "cluster: $name built in $((SECONDS - t0)) s"
}

build() {  # build MODULE_DIR LDFLAGS PACKAGE...: go build the packages into $bin unless up to date
  local dir="$1" ldflags="$2"; shift 2
  local stamp="$cache/.$(basename "$dir").stamp"
  local sum
  local tags="${PROM_TAGS:-}"
  sum="$(cd "$here/go/$dir" && cat go.mod $(ls go.sum *.go 2>/dev/null) | sha256sum | cut -c1-16)-$ldflags-$tags-$*"
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
  k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet
[[ -x "$bin/server" ]] && mv -f "$bin/server" "$bin/etcd"   # the etcd module's main package is named server
build dns "" .
[[ -x "$bin/dns" ]] && mv -f "$bin/dns" "$bin/coredns"
build helm "" helm.sh/helm/v4/cmd/helm
# Prometheus with Kubernetes service discovery (Debian's package has none): the autoscaler tests.
PROM_TAGS="remove_all_sd,enable_kubernetes_sd" build prometheus "" github.com/prometheus/prometheus/cmd/prometheus
# Real nodes: the node programs, each at its release (their own go.mod and go.sum, checked).
INSTALL_TAGS="no_btrfs,no_devmapper,no_zfs" install_at containerd v2.4.2 \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
install_at cni-plugins v1.10.0 github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/main/loopback github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/meta/portmap
install_at registry v3.1.2 github.com/distribution/distribution/v3/cmd/registry
install_at crane v0.22.1 github.com/google/go-containerregistry/cmd/crane
install_at kube-network-policies v0.8.0 sigs.k8s.io/kube-network-policies/cmd
[[ -x "$bin/cmd" ]] && mv -f "$bin/cmd" "$bin/kube-network-policies"   # its main package is cmd/
build probe "" .
echo "$bin"
