"""The AWS ParallelCluster back end: the cluster configuration (a pure function) and the stack that deploys it."""
