"""``jc.train_torch`` and ``jc.tune`` on the cluster: Ray Train and Ray Tune driven from runner actors."""
