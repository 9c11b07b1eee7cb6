"""The balance planner (paper §3.3): what was measured, the cost terms, the sizing search
and the plan; pure functions, no I/O. plan.py is the entry point."""
