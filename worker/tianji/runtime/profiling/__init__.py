"""`tianji profile`: the measurements the planner reads (role throughput, thread scaling,
links), taken from the real roles."""
