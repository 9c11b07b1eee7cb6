"""Sample Factory's own Atari entry point (sf_examples.atari.train_atari), unchanged, after
`import ale_py`: ale-py >= 0.9 registers the PongNoFrameskip-v4 id on import, which gymnasium 0.29
no longer does by itself. The import sits at the top level so that Sample Factory's spawned
workers, which import this file again as __mp_main__, register it too.

    bench/peers/.venv-sample-factory/bin/python bench/peers/sf_pong.py --env=atari_pong ...
"""
import sys

import ale_py  # noqa: F401 - registers the Atari ids with gymnasium

if __name__ == "__main__":
    from sf_examples.atari.train_atari import main

    sys.exit(main())
