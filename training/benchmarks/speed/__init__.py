"""Benchmarks of training speed: step.py (`bench step`: images/s and MFU of one training step),
pretrain.py (`bench pretrain`: pretrain's own loop beside the same step), allreduce.py (the
allocation's all-reduce bus bandwidth), scaling.py (the weak-scaling model's command, fed those two)
and gpu_summary.py (the sum of scripts/gpu-bench.sh's figures)."""
