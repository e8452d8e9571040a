"""Pages of the pools app, by who uses them: tenants' requests and pools (`requests.py`, and the parts of
the tenant and project pages in `sections.py`), the approvers' workspace (`approvals.py`), the operators'
capacity pages (`capacity.py`) and their drain buttons (`drains.py`). The what-if pages are pools/whatif/."""
