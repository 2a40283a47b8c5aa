"""Deployment manifests beyond one node (``specserve deploy``): Kubernetes Deployment and
LeaderWorkerSet for the TensorRT-LLM engine flow, NVIDIA Dynamo and Slurm for the PyTorch route."""
