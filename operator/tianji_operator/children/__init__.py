"""A TianJiJob's child objects: what they are (builders.py: pure, job + plan in, manifests
out), the two choices made once at creation that shape them (statevolume.py: where learner
state lives; hostports.py: a host-network job's node ports), and how they are kept over the
job's life (lifecycle.py: re-created when deleted, refused creations, suspension, the end).

Keep this file free of code: modules import what they need from each other."""
