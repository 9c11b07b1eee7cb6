"""What runs while a TianJiJob lives: the monitor timer (monitor.py) with what it reads and
decides (podreports.py: the pods' reports; counting.py: those reports as the job's accounting
and status numbers, also on pod events; restarts.py: restart counts; nodelost.py: pods
stranded on a lost node), and the autoscale timer (scaling.py) with its decision
(autoscaler.py).

Keep this file free of code: modules import what they need from each other."""
