"""The Kubernetes side: the cluster operator, the per-pod agent, and what they share.

Rule: this package may use everything below it (loop, runner, stores, hosts);
nothing below it imports from here.
"""
