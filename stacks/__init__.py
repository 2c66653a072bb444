"""The CDK app's stacks, by back end: shared/ (settings, network, storage, image pipeline, node bundle,
monitoring and the names every back end agrees on), parallelcluster/ and pcs/ (one cluster stack each);
app_builder.py composes them."""
