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

.PHONY: install peers cluster cluster-up cluster-down train test test-fast test-cluster bench crd lint e2e images image-tools image-base test-images clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || (apt-get update && apt-get install -y python3-venv)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,test]'
	@touch $(STAMP)

# The peers of bench/atari_peers.py (Sample Factory, CleanRL on EnvPool, SB3), each in its own
# pinned environment under bench/peers/ (never in TianJi's). A peer that does not install here
# leaves its pip output in bench/peers/.venv-NAME/INSTALL-FAILED; the bench records it as the reason.
PEER_NAMES  := sample-factory cleanrl-envpool sb3
PEER_STAMPS := $(foreach p,$(PEER_NAMES),bench/peers/.venv-$(p)/.installed)

peers: install $(PEER_STAMPS)

bench/peers/.venv-%/.installed: bench/peers/requirements/%.txt
	@test -x bench/peers/.venv-$*/bin/python || $(PYTHON) -m venv bench/peers/.venv-$*
	@rm -f bench/peers/.venv-$*/INSTALL-FAILED
	@echo "make peers: $* (bench/peers/requirements/$*.txt)"
	@if bench/peers/.venv-$*/bin/pip install -q -r $< > bench/peers/.venv-$*/install.log 2>&1; then \
	  touch $@; else mv bench/peers/.venv-$*/install.log bench/peers/.venv-$*/INSTALL-FAILED; \
	  echo "make peers: $* did not install: bench/peers/.venv-$*/INSTALL-FAILED"; fi

# A real Kubernetes control plane built from the Kubernetes Go modules (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, CoreDNS, helm) into ~/.cache/tianji/;
# cold: many minutes on 2 cores; warm: seconds.
cluster:
	@command -v go >/dev/null 2>&1 || { echo "make cluster: needs Go >= 1.26.7 (go not found on PATH)"; exit 2; }
	bash cluster/build.sh
	@# Real nodes' OCI runtime, nft and iptables (NetworkPolicy's hook; docs/local-cluster.md), from the distribution.
	@command -v runc >/dev/null 2>&1 && command -v nft >/dev/null 2>&1 && command -v iptables >/dev/null 2>&1 || \
	  ! command -v apt-get >/dev/null 2>&1 || \
	  apt-get install -y -q --no-install-recommends runc nftables iptables >/dev/null || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends runc nftables iptables >/dev/null; }

# A local cluster (2 nodes as network namespaces, pods as processes; RUNTIME=crun: containers from
# the images in buildah storage) for people; see docs/local-cluster.md. TIANJI_CLUSTER_INDEX=N
# (0-15, default 0) picks the cluster for up, down and status alike, so side-by-side clusters
# are never stopped by mistake.
CLUSTER_INDEX_ARG = $(if $(TIANJI_CLUSTER_INDEX),--index=$(TIANJI_CLUSTER_INDEX))

cluster-up: install cluster
	$(CLUSTER) up $(CLUSTER_INDEX_ARG) $(if $(RUNTIME),--runtime=$(RUNTIME)) $(if $(NODES),--node-kind=$(NODES))

cluster-down:
	$(CLUSTER) down $(CLUSTER_INDEX_ARG)

train: install
	$(VENV)/bin/tianji run $(JOB)

# ruff's rules over every Python tree; the formatter's check, mypy and the layer rules (pyproject.toml
# [tool.importlinter], CONTRIBUTING.md) on the code the operator and the control plane run.
LINTED    := worker operator bench tests cluster
FORMATTED := worker/tianji/control operator/tianji_operator
lint: install
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(FORMATTED)
	$(VENV)/bin/mypy
	PYTHONPATH=worker:operator $(VENV)/bin/lint-imports --no-cache

# TIANJI_SKIP_CLUSTER=1: no Go build, and the cluster tier skips (a machine without root or Go).
test: install lint $(if $(filter 1,$(TIANJI_SKIP_CLUSTER)),,cluster)
	$(PY) -m pytest -q -ra --durations=30 $(PYTEST_ARGS)

# The real-control-plane tier alone (also part of `make test`).
test-cluster: install cluster
	$(PY) -m pytest -q -ra tests/cluster $(PYTEST_ARGS)

# Everything but the agents-that-learn tests (seconds instead of minutes).
test-fast: install
	$(PY) -m pytest -q -ra -m "not slow and not cluster" $(PYTEST_ARGS)

bench: install
	$(PY) -m bench.converge
	$(PY) -m bench.transport

crd: install
	$(VENV)/bin/tianji crd > crds/tianjijob.yaml
	cp crds/tianjijob.yaml charts/tianji-operator/crds/tianjijob.yaml

e2e: install
	$(PY) -m pytest -q -ra tests/e2e --e2e

# Both images (images/README.md): `docker build` where an engine answers, else buildah (no daemon),
# else a message naming what is missing. Settings pass through: BASE_IMAGE, TORCH_INDEX_URL, ENGINE,
# VERSION, ONLY=worker|operator. Unset, the base is Docker Hub's python where it can be pulled, else
# `make image-base`'s (made if need be), and torch comes from PyTorch's CPU index where it answers,
# else the configured pip index; images/build.sh says which it used.
images:
	images/build.sh

# buildah, crun and debootstrap from the distribution (Debian/Ubuntu; root).
image-tools:
	@command -v apt-get >/dev/null 2>&1 || { echo "make image-tools: no apt-get; install buildah, crun and debootstrap yourself"; exit 2; }
	apt-get install -y --no-install-recommends buildah crun debootstrap || { apt-get update && apt-get install -y --no-install-recommends buildah crun debootstrap; }

# A python3 base image from Debian's packages (debootstrap), for machines with no registry.
image-base:
	images/local-base.sh

# The image tier (tests/images): builds both images (skipped when their inputs did not change) and
# runs them with crun: a CartPole job in worker containers, the operator's /healthz. Minutes, and
# gigabytes the first time: not part of `make test`.
test-images: install
	TIANJI_TEST_IMAGES=1 $(PY) -m pytest -q -ra -s tests/images $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
