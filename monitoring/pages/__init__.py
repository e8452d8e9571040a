"""Monitoring's pages: the operators' fleet, GPU and pool pages (`fleet`), the tenant's pool and tenant
sections (`tenant`), its part of the capacity pages (`capacity`), and the charts they draw (`charts`)."""
