"""What both engines agree on: addressing and ports, the worker launch contract, the role
report format and the job's accounting, CurveZMQ keys, the replay rate limiter."""
