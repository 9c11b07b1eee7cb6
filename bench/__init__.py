"""TianJi's benchmarks: each module measures one thing and prints one JSON object.

Run from the repository root as modules, e.g. `python -m bench.converge` or
`python -m bench.transport --experiment collection`. What they share lives in
`bench.harness`: the stamp every result carries (command, date, machine), the JSON
emit, the probe of this machine, and one `tianji run` of a job read back from its run
directory. `python -m bench.render_docs` renders docs/benchmarks.md's generated blocks
from the results kept in docs/results/.
"""
