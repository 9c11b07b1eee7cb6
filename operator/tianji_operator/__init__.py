"""TianJi's Kubernetes operator (Kopf): reconciles TianJiJob objects into pods.

Import name `tianji_operator` (a module named `operator` would shadow the
standard library). `python -m tianji_operator` runs it; see docs/operator.md.
Keep this file free of code: modules import what they need from each other.
"""
