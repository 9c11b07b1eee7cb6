"""Kubernetes test doubles: the API emulator, the operator under test, metric fakes, and a pod
network for containers run without a cluster (the image tier)."""
