"""Kubernetes test doubles: the API emulator, the operator under test, metric fakes."""
