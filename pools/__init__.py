"""Capacity and GPU pools: clusters, MIG stock, requests, placement and provisioning."""
