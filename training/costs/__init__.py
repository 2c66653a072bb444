"""What a run costs, on the ground floor: the instance facts (instances.py), dated prices (prices.py),
the FLOP count (flops.py), the weak-scaling model (scaling.py) and the bill after a run (bill.py).

Standard library only, importing nothing of the package but the ViT sizes (training/config/archs.py),
so that the planner, the benchmarks, the run summary, the evaluations and the CDK app (stacks/) read
the same figures without importing one another (tests/training/test_structure.py).
"""
