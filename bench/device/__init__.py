"""The GPU device check (run.sh): what it measures is in run.py."""
