"""The CDK app's stacks, settings and the ParallelCluster configuration builder."""
