# TianJi: `make train` trains the embedded default locally; `make test` runs the suite.
# Both install everything they need from nothing (venv + pip) on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOB    ?= examples/cartpole-ppo.yaml
PYTEST_ARGS ?=
# The Go toolchain builds the local cluster (cluster/build.sh); machines keep it in /usr/local/go.
export PATH := $(PATH):/usr/local/go/bin
CLUSTER := PYTHONPATH=cluster $(PY) -m localcluster

.PHONY: install cluster cluster-up cluster-down train test test-fast test-cluster bench crd lint e2e images clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || (apt-get update && apt-get install -y python3-venv)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,test]'
	@touch $(STAMP)

# A real Kubernetes control plane built from the Kubernetes Go modules (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, CoreDNS, helm) into ~/.cache/tianji/;
# cold: many minutes on 2 cores; warm: seconds.
cluster:
	@command -v go >/dev/null 2>&1 || { echo "make cluster: needs Go >= 1.26 (go not found on PATH)"; exit 2; }
	bash cluster/build.sh

# A local cluster (2 nodes as network namespaces, pods as processes) for people; see docs/local-cluster.md.
cluster-up: install cluster
	$(CLUSTER) up

cluster-down:
	$(CLUSTER) down

train: install
	$(VENV)/bin/tianji run $(JOB)

# TIANJI_SKIP_CLUSTER=1: no Go build, and the cluster tier skips (a machine without root or Go).
test: install $(if $(filter 1,$(TIANJI_SKIP_CLUSTER)),,cluster)
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

# The real-control-plane tier alone (also part of `make test`).
test-cluster: install cluster
	$(PY) -m pytest -q -ra tests/cluster $(PYTEST_ARGS)

# Everything but the agents-that-learn tests (seconds instead of minutes).
test-fast: install
	$(PY) -m pytest -q -ra -m "not slow and not cluster" $(PYTEST_ARGS)

bench: install
	$(PY) bench/converge.py
	$(PY) bench/transport.py

crd: install
	$(VENV)/bin/tianji crd > crds/tianjijob.yaml
	cp crds/tianjijob.yaml charts/tianji-operator/crds/tianjijob.yaml

e2e: install
	$(PY) -m pytest -q -ra tests/e2e --e2e

images:
	@if docker info >/dev/null 2>&1; then \
	  docker build -f images/worker.Dockerfile -t tianji-worker:0.1.0 . && \
	  docker build -f images/operator.Dockerfile -t tianji-operator:0.1.0 . ; \
	else echo "make images: no Docker engine reachable here (docker info failed); build on a machine with one." ; fi

clean:
	rm -rf $(VENV) runs .pytest_cache
