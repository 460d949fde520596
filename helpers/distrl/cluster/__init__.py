"""Ape-X on a multi-node Ray cluster (notebook 04): local nodes as separate processes (local), the
autoscaler that rehearses GKE's Spot pool (autoscale), the manifests' own commands rehearsed
(rehearsal), and Ray jobs followed within a deadline (jobs)."""
