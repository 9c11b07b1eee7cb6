"""The torch-free control layer both engines share (the operator image imports only this).

    contracts/  what the engines and the roles agree on: addresses and ports, the worker
                launch contract, the role report format and the job's accounting
    spec/       the TianJiJob: pydantic model, YAML reading, CRD generation
    planner/    the balance planner: profile -> cost terms -> prediction -> search -> plan

Layers (enforced by import-linter, see CONTRIBUTING.md): planner may import spec and
contracts, spec may import contracts, contracts import neither; nothing here imports torch,
zmq, gymnasium or anything outside tianji.control.
"""
