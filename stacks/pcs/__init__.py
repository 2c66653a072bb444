"""The AWS PCS back end (`-c backend=pcs`): node groups and queues, node launch templates, and the stack."""
