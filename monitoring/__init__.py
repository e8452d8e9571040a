"""Monitoring: GPU health samples, rollups, alerts and the Prometheus export."""
